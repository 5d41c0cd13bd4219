#pragma once
// Flags shared by several commands.
//   AccessFlags: the router's HTTP access flags, for `tandem router` and `tandem serve` (which
//   hands them to its router): --api-key, --api-key-file, --allowed-host, --cors-origin
//   (runtime/router/access_policy.h says what each enforces).
//   ServiceAuthFlags: the service identity of every gRPC hop, for `tandem prefill|decode|router|
//   serve`: --service-token-file, --tls-ca/--tls-cert/--tls-key (each also from an environment
//   variable: TANDEM_SERVICE_TOKEN_FILE, TANDEM_TLS_CA, TANDEM_TLS_CERT, TANDEM_TLS_KEY),
//   --insecure-services (runtime/auth/service_identity.h says what each mode protects).
//   FrontendModelFlags: how the router's OpenAI frontend serves the model, for `tandem router`
//   and `tandem serve` (which hands them to its router): --served-model-name, --chat-template,
//   --generation-config, --tool-call-parser (runtime/router/frontend.h).
//   --cuda-tuning: the CUDA runner's kernel plan (runtime/model/cuda/cuda_tuning.h), for the
//   commands that build a CUDA runner: `tandem prefill|decode|generate|profile`, and `tandem serve`
//   (which hands it to its workers).

#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "runtime/auth/service_identity.h"

namespace tandem::cli {

struct AccessFlags {
  std::vector<std::string> api_keys;
  std::string api_key_file;
  std::vector<std::string> allowed_hosts;
  std::vector<std::string> cors_origins;
};

void AddAccessFlags(CLI::App* cmd, AccessFlags* flags);

struct FrontendModelFlags {
  std::string served_model_name;  // "": the model directory's name
  std::string chat_template;      // "": the model's
  std::string generation_config = "auto";
  std::string tool_call_parser = "auto";
};

void AddFrontendModelFlags(CLI::App* cmd, FrontendModelFlags* flags);
// The same flags as `tandem router` arguments (the template's path made absolute).
std::vector<std::string> FrontendModelArgs(const FrontendModelFlags& flags);

struct ServiceAuthFlags {
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  bool insecure = false;

  bool any() const {
    return !token_file.empty() || !tls_ca.empty() || !tls_cert.empty() || !tls_key.empty() ||
           insecure;
  }
  // The same flags as command-line arguments (for a child process).
  std::vector<std::string> Args() const;
};

void AddServiceAuthFlags(CLI::App* cmd, ServiceAuthFlags* flags);

// --cuda-tuning SPEC into *spec; a spec ParseCudaTuning refuses is a usage error at parse time
// (the message names the key and what it takes). CPU runners ignore it.
void AddCudaTuningFlag(CLI::App* cmd, std::string* spec);

// --log-format text|json (runtime/base/logging.h), for every serving command.
void AddLogFormatFlag(CLI::App* cmd, std::string* format);
// Sets the process's log format (the flag's check admits only the two names).
void ApplyLogFormat(const std::string& format);

// The identity the flags describe (ServiceIdentity::Create's errors; --insecure-services together
// with a credential is InvalidArgument).
absl::StatusOr<std::shared_ptr<const auth::ServiceIdentity>> MakeServiceIdentity(
    const ServiceAuthFlags& flags);

}  // namespace tandem::cli
