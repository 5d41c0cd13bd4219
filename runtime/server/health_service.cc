#include "runtime/server/health_service.h"

#include <utility>

namespace tandem::server {

using grpc::health::v1::HealthCheckResponse;

HealthService::HealthService(std::shared_ptr<const auth::ServiceIdentity> identity,
                             const std::vector<std::string>& services)
    : identity_(std::move(identity)) {
  absl::MutexLock lock(&mu_);
  serving_[""] = true;
  for (const std::string& name : services) serving_[name] = true;
}

void HealthService::SetServing(bool serving) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, value] : serving_) value = serving;
}

grpc::Status HealthService::Check(grpc::ServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  HealthCheckResponse* response) {
  if (grpc::Status s = identity_->Authenticate(*context); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = serving_.find(request->service());
  if (it == serving_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service");
  response->set_status(it->second ? HealthCheckResponse::SERVING
                                  : HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(grpc::ServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* /*request*/,
                                  grpc::ServerWriter<HealthCheckResponse>* /*writer*/) {
  if (grpc::Status s = identity_->Authenticate(*context); !s.ok()) return s;
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "Watch: use Check");
}

}  // namespace tandem::server
