#include "cli/access_flags.h"

#include <filesystem>

#include "runtime/base/logging.h"
#include "runtime/model/cuda/cuda_tuning.h"

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

namespace tandem::cli {

void AddServiceAuthFlags(CLI::App* cmd, ServiceAuthFlags* flags) {
  cmd->add_option("--service-token-file", flags->token_file,
                  "Shared secret of this deployment's services (one token per line, >= 16 "
                  "characters, mode 0600): sent on every gRPC call this process makes and "
                  "required on every call it serves")
      ->envname("TANDEM_SERVICE_TOKEN_FILE");
  cmd->add_option("--tls-ca", flags->tls_ca,
                  "mTLS: PEM bundle of the cluster CA that peers' certificates must chain to")
      ->envname("TANDEM_TLS_CA");
  cmd->add_option("--tls-cert", flags->tls_cert,
                  "mTLS: this service's PEM certificate chain (reloaded when it changes)")
      ->envname("TANDEM_TLS_CERT");
  cmd->add_option("--tls-key", flags->tls_key, "mTLS: this service's PEM private key")
      ->envname("TANDEM_TLS_KEY");
  cmd->add_flag("--insecure-services", flags->insecure,
                "Serve and call gRPC without any authentication (any local process can then "
                "drive, read and cancel requests): only on a network you vouch for");
}

void AddLogFormatFlag(CLI::App* cmd, std::string* format) {
  cmd->add_option("--log-format", *format,
                  "text (default) or json: one JSON object per log line (ts, level, source, msg)")
      ->check(CLI::IsMember({"text", "json"}));
}

void ApplyLogFormat(const std::string& format) {
  LogFormat parsed = LogFormat::kText;
  if (ParseLogFormat(format, &parsed)) SetLogFormat(parsed);
}

std::vector<std::string> ServiceAuthFlags::Args() const {
  std::vector<std::string> args;
  if (!token_file.empty()) args.insert(args.end(), {"--service-token-file", token_file});
  if (!tls_ca.empty()) args.insert(args.end(), {"--tls-ca", tls_ca});
  if (!tls_cert.empty()) args.insert(args.end(), {"--tls-cert", tls_cert});
  if (!tls_key.empty()) args.insert(args.end(), {"--tls-key", tls_key});
  if (insecure) args.push_back("--insecure-services");
  return args;
}

absl::StatusOr<std::shared_ptr<const auth::ServiceIdentity>> MakeServiceIdentity(
    const ServiceAuthFlags& flags) {
  if (flags.insecure && (!flags.token_file.empty() || !flags.tls_ca.empty() ||
                         !flags.tls_cert.empty() || !flags.tls_key.empty())) {
    return absl::InvalidArgumentError(
        "--insecure-services contradicts --service-token-file / --tls-*: choose one");
  }
  auth::ServiceAuthOptions options;
  options.token_file = flags.token_file;
  options.tls_ca_file = flags.tls_ca;
  options.tls_cert_file = flags.tls_cert;
  options.tls_key_file = flags.tls_key;
  options.allow_unauthenticated = flags.insecure;
  return auth::ServiceIdentity::Create(options);
}

void AddFrontendModelFlags(CLI::App* cmd, FrontendModelFlags* flags) {
  cmd->add_option("--served-model-name", flags->served_model_name,
                  "Model name clients use (default: the model directory's name)");
  cmd->add_option("--chat-template", flags->chat_template,
                  "Jinja chat template file to use instead of the model's (docs/api.md)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--generation-config", flags->generation_config,
                  "Sampling defaults: auto (the model's generation_config.json), vllm or none (no "
                  "defaults), or a directory holding generation_config.json (default auto)");
  cmd->add_option("--tool-call-parser", flags->tool_call_parser,
                  "How tool_choice auto reads calls from the output: auto (from the chat "
                  "template), hermes, llama3_json or none (default auto; docs/tool_calling.md)")
      ->check(CLI::IsMember({"auto", "hermes", "llama3_json", "none"}));
}

std::vector<std::string> FrontendModelArgs(const FrontendModelFlags& flags) {
  std::vector<std::string> args;
  if (!flags.served_model_name.empty()) {
    args.insert(args.end(), {"--served-model-name", flags.served_model_name});
  }
  if (!flags.chat_template.empty()) {
    // The router runs from this directory too, but an absolute path survives any cwd.
    args.insert(args.end(),
                {"--chat-template", std::filesystem::absolute(flags.chat_template).string()});
  }
  args.insert(args.end(), {"--generation-config", flags.generation_config, "--tool-call-parser",
                           flags.tool_call_parser});
  return args;
}

void AddCudaTuningFlag(CLI::App* cmd, std::string* spec) {
  cmd->add_option("--cuda-tuning", *spec,
                  "The CUDA runner's kernel plan: key=value[,key=value...] (keys, defaults and "
                  "effects in docs/tuning.md; default: the measured choices; ignored on the CPU)")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            const absl::StatusOr<CudaTuning> tuning = ParseCudaTuning(value);
            return tuning.ok() ? std::string() : std::string(tuning.status().message());
          },
          "SPEC"));
}

}  // namespace tandem::cli
