#include "runtime/server/grpc_server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace tandem::server {

absl::StatusOr<GrpcServer> StartGrpcServer(const std::string& host, int port,
                                           const std::vector<grpc::Service*>& services,
                                           const std::vector<std::string>& health_names) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(host, ":", port);
  GrpcServer out;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &out.port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || out.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", address));
  }
  out.health_names = health_names;
  grpc::HealthCheckServiceInterface* health = out.server->GetHealthCheckService();
  if (health != nullptr) {
    for (const std::string& name : health_names) health->SetServingStatus(name, true);
    health->SetServingStatus(true);
  }
  return out;
}

void GrpcServer::Shutdown(absl::Duration drain) {
  if (server == nullptr) return;
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) {
    for (const std::string& name : health_names) health->SetServingStatus(name, false);
    health->SetServingStatus(false);
  }
  server->Shutdown(absl::ToChronoTime(absl::Now() + drain));
  server->Wait();
  server.reset();
}

}  // namespace tandem::server
