#pragma once
// Service identity: how Tandem's services (router, prefill and decode workers) prove to each other
// that they belong to one deployment, on every gRPC hop (router to worker, decode to prefill,
// Worker.StreamStats, grpc.health.v1).
//
// Modes (ServiceAuthOptions):
//   token  a per-deployment shared secret. Clients send it in each call's `authorization: Bearer`
//          metadata; servers compare it in constant time against every line of the token file
//          (rotation: add the new token on a second line, roll the services, drop the old one).
//          It travels in clear text: it stops processes and hosts that cannot read the file or
//          the traffic, not an observer on the wire (use mtls across hosts).
//   mtls   TLS both ways with a cluster CA: the server requires and verifies a client certificate
//          signed by the CA, the client verifies the server's certificate (its SAN must name the
//          address dialled). The files are watched and reloaded (`tls_reload_interval`), so
//          rotating a certificate needs no restart. A token may be required on top.
//   none   no authentication: only with `allow_unauthenticated` (in-process tests, or a network
//          the operator vouches for). Create refuses a configuration without any of the three.
//
// Servers call Authenticate first in every handler: UNAUTHENTICATED touches nothing. The services'
// drift test (runtime/server/service_auth_test.cc) calls every method of every service without
// credentials, so a handler that forgets cannot pass.
//
// Thread safety: immutable after Create; share it (std::shared_ptr<const ServiceIdentity>).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/channel_arguments.h"

namespace tandem::auth {

struct ServiceAuthOptions {
  // One token per line (blank lines and surrounding whitespace ignored; at least 16 characters
  // each). The first is sent, any is accepted. The file must not be readable by group or others.
  std::string token_file;
  // mTLS: all three PEM files, or none.
  std::string tls_ca_file;    // the cluster CA bundle peers' certificates must chain to
  std::string tls_cert_file;  // this service's certificate chain
  std::string tls_key_file;   // its private key
  absl::Duration tls_reload_interval = absl::Seconds(60);
  bool allow_unauthenticated = false;
};

class ServiceIdentity {
 public:
  // InvalidArgument for an inconsistent configuration (some TLS files but not all; neither token
  // nor TLS without allow_unauthenticated); NotFound / PermissionDenied / InvalidArgument for a
  // token file that is missing, readable by others, or holds no valid token; InvalidArgument for
  // TLS files that are missing or not PEM.
  static absl::StatusOr<std::shared_ptr<const ServiceIdentity>> Create(
      const ServiceAuthOptions& options);
  // Token mode with these tokens (tests and `tandem serve`, which made them).
  static absl::StatusOr<std::shared_ptr<const ServiceIdentity>> FromTokens(
      std::vector<std::string> tokens);
  // Mode none.
  static std::shared_ptr<const ServiceIdentity> Unauthenticated();

  // "token", "mtls", "mtls+token" or "none".
  std::string mode() const;

  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  // A channel to `address` that presents this identity on every call.
  std::shared_ptr<grpc::Channel> Dial(const std::string& address,
                                      grpc::ChannelArguments args = {}) const;
  // OK, or UNAUTHENTICATED naming what was missing (never what was expected).
  grpc::Status Authenticate(const grpc::ServerContextBase& context) const;
  // Who called, for ownership checks: the verified certificate's identity under mtls, else
  // "deployment" (every token holder is the same principal).
  std::string Peer(const grpc::ServerContextBase& context) const;

  // Public for std::make_shared; use the factories.
  struct Config;
  explicit ServiceIdentity(std::shared_ptr<const Config> config) : config_(std::move(config)) {}

 private:
  std::shared_ptr<const Config> config_;
};

}  // namespace tandem::auth
