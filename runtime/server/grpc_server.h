#pragma once
// Starts a worker's gRPC server: binds host:port (0 picks a free port) with the identity's
// credentials (plaintext for token or none, TLS requiring a client certificate for mtls), registers
// the services and an authenticated grpc.health.v1.Health (health_service.h) that reports each
// named service, and the server as a whole (""), SERVING. Every service registered must call
// identity->Authenticate first in each handler (runtime/server/service_auth_test.cc checks it).
//
// Ownership: the services are not owned and must outlive the server. Threading: as grpc::Server.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "grpcpp/server.h"
#include "runtime/auth/service_identity.h"
#include "runtime/server/health_service.h"

namespace tandem::server {

struct GrpcServer {
  std::unique_ptr<HealthService> health;
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port

  // Reports NOT_SERVING, then grpc::Server::Shutdown: no new calls, in-flight calls get until
  // `deadline` and are cancelled after it; returns when every handler has returned.
  void Shutdown(absl::Duration drain);
};

// InvalidArgument without an identity; Unavailable when host:port cannot be bound.
absl::StatusOr<GrpcServer> StartGrpcServer(const std::string& host, int port,
                                           const std::vector<grpc::Service*>& services,
                                           const std::vector<std::string>& health_names,
                                           std::shared_ptr<const auth::ServiceIdentity> identity);

}  // namespace tandem::server
