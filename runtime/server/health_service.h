#pragma once
// grpc.health.v1.Health, served by Tandem itself (not gRPC's built-in service) so that it is
// authenticated like every other method (runtime/auth/service_identity.h): an unauthenticated
// Check gets UNAUTHENTICATED and learns nothing, not even which services exist.
//
// Check("") answers for the server as a whole, Check(name) for one registered service name;
// another name is NOT_FOUND (as gRPC's own service does). Watch is UNIMPLEMENTED: the router and
// Kubernetes' gRPC probes only call Check.
//
// Threading: all methods are thread-safe. Ownership: the identity is shared.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "runtime/auth/service_identity.h"

namespace tandem::server {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  // Every name in `services`, and "", start SERVING.
  HealthService(std::shared_ptr<const auth::ServiceIdentity> identity,
                const std::vector<std::string>& services);

  // Every name, and "", to SERVING or NOT_SERVING.
  void SetServing(bool serving);

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;

 private:
  const std::shared_ptr<const auth::ServiceIdentity> identity_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::server
