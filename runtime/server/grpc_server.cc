#include "runtime/server/grpc_server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/server_builder.h"

namespace tandem::server {

absl::StatusOr<GrpcServer> StartGrpcServer(const std::string& host, int port,
                                           const std::vector<grpc::Service*>& services,
                                           const std::vector<std::string>& health_names,
                                           std::shared_ptr<const auth::ServiceIdentity> identity) {
  if (identity == nullptr) {
    return absl::InvalidArgumentError("a gRPC server needs a service identity");
  }
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(host, ":", port);
  GrpcServer out;
  out.health = std::make_unique<HealthService>(identity, health_names);
  builder.AddListeningPort(address, identity->ServerCredentials(), &out.port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  builder.RegisterService(out.health.get());
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || out.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", address));
  }
  return out;
}

void GrpcServer::Shutdown(absl::Duration drain) {
  if (server == nullptr) return;
  health->SetServing(false);
  server->Shutdown(absl::ToChronoTime(absl::Now() + drain));
  server->Wait();
  server.reset();
}

}  // namespace tandem::server
