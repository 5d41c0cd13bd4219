#include "runtime/mlp/shard_info_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"
#include "runtime/mlp/mlp_shard_checks.h"

namespace tandem::mlp {

absl::StatusOr<tandem::v1::MlpInfo> FetchShardInfo(tandem::v1::MlpShard::Stub& stub,
                                                   const std::string& address,
                                                   const MlpShape& expected,
                                                   const std::string& model_fingerprint,
                                                   absl::Time give_up, const std::string& who,
                                                   MlpShape* served) {
  tandem::v1::MlpInfo info;
  grpc::Status status;
  do {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(std::min(give_up, absl::Now() + absl::Seconds(2))));
    context.set_wait_for_ready(true);
    status = stub.Info(&context, tandem::v1::MlpInfoRequest(), &info);
  } while (!status.ok() && status.error_code() != grpc::StatusCode::UNAUTHENTICATED &&
           absl::Now() < give_up);
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat(who, ": shard ", address, " did not answer Info: gRPC ",
                     static_cast<int>(status.error_code()), ": ", status.error_message()));
  }
  if (absl::Status bad = CheckShardInfo(info, expected, model_fingerprint, served); !bad.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": shard ", address, " ", bad.message()));
  }
  return info;
}

std::vector<int> UnservedLayers(const MlpShape& expected, const std::vector<MlpShape>& served) {
  std::vector<int> unserved;
  for (int l = expected.first_layer; l < expected.end_layer; ++l) {
    if (std::none_of(served.begin(), served.end(),
                     [&](const MlpShape& s) { return s.Serves(l); })) {
      unserved.push_back(l);
    }
  }
  return unserved;
}

}  // namespace tandem::mlp
