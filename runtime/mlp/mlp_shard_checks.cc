#include "runtime/mlp/mlp_shard_checks.h"

#include "absl/strings/str_cat.h"

namespace tandem::mlp {

size_t ComputeBytes(int rows, const MlpShape& shape) {
  return static_cast<size_t>(rows) * static_cast<size_t>(shape.hidden_size) * sizeof(float);
}

absl::Status CheckComputeRequest(const tandem::v1::MlpComputeRequest& request,
                                 const MlpShape& shape, int max_rows) {
  if (request.layer() < static_cast<uint32_t>(shape.first_layer) ||
      request.layer() >= static_cast<uint32_t>(shape.end_layer)) {
    return absl::InvalidArgumentError(absl::StrCat("layer: ", request.layer(),
                                                   " is not served here (layers ",
                                                   shape.first_layer, ":", shape.end_layer, ")"));
  }
  if (request.rows() < 1 || request.rows() > static_cast<uint32_t>(max_rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows: ", request.rows(), " is not in 1..", max_rows));
  }
  const size_t expected = ComputeBytes(static_cast<int>(request.rows()), shape);
  if (request.activations().size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("activations: ", request.activations().size(),
                                                   " bytes, expected ", expected,
                                                   " (rows x hidden_size float32)"));
  }
  return absl::OkStatus();
}

absl::Status CheckShardInfo(const tandem::v1::MlpInfo& info, const MlpShape& expected,
                            const std::string& model_fingerprint, MlpShape* served) {
  if (!model_fingerprint.empty() && info.model_fingerprint() != model_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat("serves model ", info.model_fingerprint(),
                                                      ", this worker runs ", model_fingerprint));
  }
  if (info.hidden_size() != static_cast<uint32_t>(expected.hidden_size) ||
      info.intermediate_size() != static_cast<uint32_t>(expected.intermediate_size) ||
      info.first_layer() >= info.end_layer() ||
      info.end_layer() > static_cast<uint32_t>(expected.end_layer)) {
    return absl::FailedPreconditionError(
        absl::StrCat("serves layers ", info.first_layer(), ":", info.end_layer(), " of hidden ",
                     info.hidden_size(), ", intermediate ", info.intermediate_size(),
                     "; this model has ", expected.end_layer, " layers of hidden ",
                     expected.hidden_size, ", intermediate ", expected.intermediate_size));
  }
  *served = expected;
  served->first_layer = static_cast<int>(info.first_layer());
  served->end_layer = static_cast<int>(info.end_layer());
  return absl::OkStatus();
}

}  // namespace tandem::mlp
