#pragma once
// Starts a worker's gRPC server: binds host:port (0 picks a free port), registers the services,
// and turns on gRPC's built-in health service (grpc.health.v1) with each named service, and the
// server as a whole (""), reported SERVING.
//
// Ownership: the services are not owned and must outlive the server. Threading: as grpc::Server.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "grpcpp/server.h"

namespace tandem::server {

struct GrpcServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port
  std::vector<std::string> health_names;

  // Reports NOT_SERVING, then grpc::Server::Shutdown: no new calls, in-flight calls get until
  // `deadline` and are cancelled after it; returns when every handler has returned.
  void Shutdown(absl::Duration drain);
};

// Unavailable when host:port cannot be bound.
absl::StatusOr<GrpcServer> StartGrpcServer(const std::string& host, int port,
                                           const std::vector<grpc::Service*>& services,
                                           const std::vector<std::string>& health_names);

}  // namespace tandem::server
