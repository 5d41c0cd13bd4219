#include "cli/access_flags.h"

namespace tandem::cli {

void AddAccessFlags(CLI::App* cmd, AccessFlags* flags) {
  cmd->add_option("--api-key", flags->api_keys,
                  "API key clients must send as 'Authorization: Bearer KEY' on /v1/ routes "
                  "(401 otherwise); repeatable. A command line is visible to other local users: "
                  "prefer --api-key-file")
      ->check([](const std::string& key) {
        return key.empty() || key.find_first_of(" \t\r\n") != std::string::npos
                   ? std::string("a key must be non-empty, without whitespace")
                   : std::string();
      });
  cmd->add_option("--api-key-file", flags->api_key_file,
                  "File of API keys, one per line ('#' comments)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--allowed-host", flags->allowed_hosts,
                  "Host header values served (name or address, no port; '*': any); repeatable. "
                  "Default: loopback names and the bound address when bound to loopback, any "
                  "host otherwise");
  cmd->add_option("--cors-origin", flags->cors_origins,
                  "Origin allowed to call the API from a browser (e.g. https://app.example; "
                  "'*': any); repeatable. Default: none (no CORS headers)");
}

}  // namespace tandem::cli
