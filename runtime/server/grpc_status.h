#pragma once
// grpc::Status <-> absl::Status at the service edge (STYLE.md 3): the code maps one to one (both
// use the canonical google.rpc codes) and the message is kept.
//
// Pure functions, thread-safe.

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tandem::server {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace tandem::server
