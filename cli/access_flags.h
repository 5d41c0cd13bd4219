#pragma once
// The router's access flags, shared by `tandem router` and `tandem serve` (which hands them to
// its router): --api-key, --api-key-file, --allowed-host, --cors-origin
// (runtime/router/access_policy.h says what each enforces).

#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace tandem::cli {

struct AccessFlags {
  std::vector<std::string> api_keys;
  std::string api_key_file;
  std::vector<std::string> allowed_hosts;
  std::vector<std::string> cors_origins;
};

void AddAccessFlags(CLI::App* cmd, AccessFlags* flags);

}  // namespace tandem::cli
