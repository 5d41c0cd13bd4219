#pragma once
// Test support for runtime/mlp: the service credential the tests' shards and workers share, and a
// gRPC server on a free loopback port for one service. Failures abort the test binary (CHECK).

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "runtime/auth/service_identity.h"
#include "runtime/base/logging.h"
#include "runtime/server/grpc_server.h"

namespace tandem::mlp {

inline const std::string kTestServiceToken = "mlp-shard-test-token-0123456789abcdef";

inline std::shared_ptr<const auth::ServiceIdentity> Identity(
    const std::string& token = kTestServiceToken) {
  auto identity = auth::ServiceIdentity::FromTokens({token});
  CHECK(identity.ok()) << identity.status();
  return *identity;
}

struct Server {
  // On `port` (0: a free one).
  Server(grpc::Service* service, const std::string& health_name, int port = 0) {
    auto started = server::StartGrpcServer("127.0.0.1", port, {service}, {health_name}, Identity());
    CHECK(started.ok()) << started.status();
    grpc = *std::move(started);
  }
  ~Server() { grpc.Shutdown(absl::ZeroDuration()); }
  std::string address() const { return absl::StrCat("127.0.0.1:", grpc.port); }
  server::GrpcServer grpc;
};

}  // namespace tandem::mlp
