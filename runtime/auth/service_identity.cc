#include "runtime/auth/service_identity.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/support/client_interceptor.h"
#include "runtime/base/secrets.h"

namespace tandem::auth {

struct ServiceIdentity::Config {
  std::vector<std::string> tokens;  // accepted; tokens[0] is sent
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> tls;  // null: no mTLS
};

namespace {

constexpr char kAuthorization[] = "authorization";
constexpr char kBearer[] = "Bearer ";
constexpr size_t kMinTokenChars = 16;

// Adds `authorization: Bearer TOKEN` to each call's initial metadata.
class TokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorization, *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::shared_ptr<const std::string> header)
      : header_(std::move(header)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new TokenInterceptor(header_.get());
  }

 private:
  std::shared_ptr<const std::string> header_;  // outlives every interceptor of the channel
};

absl::Status ValidateToken(const std::string& token) {
  if (token.size() < kMinTokenChars) {
    return absl::InvalidArgumentError(
        absl::StrCat("a service token must be at least ", kMinTokenChars, " characters"));
  }
  for (char ch : token) {
    if (!absl::ascii_isgraph(static_cast<unsigned char>(ch))) {
      return absl::InvalidArgumentError(
          "a service token must be printable ASCII without whitespace");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " '", path, "': cannot be read"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& path) {
  struct stat st = {};
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("--service-token-file '", path, "': no such file"));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("--service-token-file '", path,
                     "': readable by group or others; chmod 600 it (a Kubernetes Secret volume: "
                     "defaultMode 0400)"));
  }
  auto text = ReadFile(path, "--service-token-file");
  if (!text.ok()) return text.status();
  std::vector<std::string> tokens;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::string token(line);
    if (absl::Status s = ValidateToken(token); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--service-token-file '", path, "' line ",
                                                     tokens.size() + 1, ": ",
                                                     std::string(s.message())));
    }
    tokens.push_back(std::move(token));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--service-token-file '", path, "': holds no token"));
  }
  return tokens;
}

absl::Status CheckPem(const std::string& path, const char* flag) {
  auto text = ReadFile(path, flag);
  if (!text.ok()) return absl::InvalidArgumentError(text.status().message());
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " '", path, "': not a PEM file"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const ServiceIdentity>> ServiceIdentity::Create(
    const ServiceAuthOptions& options) {
  auto config = std::make_shared<Config>();
  const int tls_files =
      !options.tls_ca_file.empty() + !options.tls_cert_file.empty() + !options.tls_key_file.empty();
  if (tls_files != 0 && tls_files != 3) {
    return absl::InvalidArgumentError("mTLS needs all of --tls-ca, --tls-cert and --tls-key");
  }
  if (!options.token_file.empty()) {
    auto tokens = ReadTokenFile(options.token_file);
    if (!tokens.ok()) return tokens.status();
    config->tokens = *std::move(tokens);
  }
  if (tls_files == 3) {
    for (const auto& [path, flag] : {std::pair{&options.tls_ca_file, "--tls-ca"},
                                     std::pair{&options.tls_cert_file, "--tls-cert"},
                                     std::pair{&options.tls_key_file, "--tls-key"}}) {
      if (absl::Status s = CheckPem(*path, flag); !s.ok()) return s;
    }
    const auto interval = static_cast<unsigned>(
        std::max<int64_t>(1, absl::ToInt64Seconds(options.tls_reload_interval)));
    config->tls = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        options.tls_key_file, options.tls_cert_file, options.tls_ca_file, interval);
  }
  if (config->tokens.empty() && config->tls == nullptr && !options.allow_unauthenticated) {
    return absl::InvalidArgumentError(
        "no service credential: give --service-token-file, or --tls-ca/--tls-cert/--tls-key, "
        "or --insecure-services to run gRPC without authentication");
  }
  return std::make_shared<const ServiceIdentity>(std::move(config));
}

absl::StatusOr<std::shared_ptr<const ServiceIdentity>> ServiceIdentity::FromTokens(
    std::vector<std::string> tokens) {
  if (tokens.empty()) return absl::InvalidArgumentError("no token");
  for (const std::string& token : tokens) {
    if (absl::Status s = ValidateToken(token); !s.ok()) return s;
  }
  auto config = std::make_shared<Config>();
  config->tokens = std::move(tokens);
  return std::make_shared<const ServiceIdentity>(std::move(config));
}

std::shared_ptr<const ServiceIdentity> ServiceIdentity::Unauthenticated() {
  return std::make_shared<const ServiceIdentity>(std::make_shared<const Config>());
}

std::string ServiceIdentity::mode() const {
  if (config_->tls != nullptr) return config_->tokens.empty() ? "mtls" : "mtls+token";
  return config_->tokens.empty() ? "none" : "token";
}

std::shared_ptr<grpc::ServerCredentials> ServiceIdentity::ServerCredentials() const {
  if (config_->tls == nullptr) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(config_->tls);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::Channel> ServiceIdentity::Dial(const std::string& address,
                                                     grpc::ChannelArguments args) const {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (config_->tls != nullptr) {
    grpc::experimental::TlsChannelCredentialsOptions options;
    options.set_certificate_provider(config_->tls);
    options.watch_root_certs();
    options.watch_identity_key_cert_pairs();
    credentials = grpc::experimental::TlsCredentials(options);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  if (config_->tokens.empty()) return grpc::CreateCustomChannel(address, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<TokenInterceptorFactory>(
      std::make_shared<const std::string>(absl::StrCat(kBearer, config_->tokens.front()))));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args,
                                                                 std::move(creators));
}

grpc::Status ServiceIdentity::Authenticate(const grpc::ServerContextBase& context) const {
  if (config_->tls != nullptr) {
    const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    if (auth == nullptr || !auth->IsPeerAuthenticated()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "no verified client certificate of this deployment's CA");
    }
  }
  if (config_->tokens.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto [begin, end] = metadata.equal_range(kAuthorization);
  if (begin == end) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing service credential (authorization metadata)");
  }
  if (std::next(begin) != end) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "more than one authorization value");
  }
  const absl::string_view value(begin->second.data(), begin->second.size());
  if (!absl::StartsWith(value, kBearer)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "authorization metadata is not a Bearer token");
  }
  const absl::string_view presented = value.substr(sizeof(kBearer) - 1);
  bool matched = false;
  for (const std::string& token : config_->tokens) matched |= ConstantTimeEquals(presented, token);
  if (!matched) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "service token not accepted");
  }
  return grpc::Status::OK;
}

std::string ServiceIdentity::Peer(const grpc::ServerContextBase& context) const {
  if (config_->tls == nullptr) return "deployment";
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return "";
  std::string peer;
  for (const grpc::string_ref& id : auth->GetPeerIdentity()) {
    if (!peer.empty()) peer += ",";
    peer.append(id.data(), id.size());
  }
  return peer;
}

}  // namespace tandem::auth
