#include "runtime/mlp/mlp_shard_checks.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/mlp/ipc_doorbell.h"

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

namespace {

bool LowerHex(const std::string& s, size_t length) {
  if (s.size() != length) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

absl::Status CheckAttachRequest(const tandem::v1::MlpAttachRequest& request, int max_rows) {
  if (request.max_rows() < 1 || request.max_rows() > static_cast<uint32_t>(max_rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_rows ", request.max_rows(), " is not in 1..", max_rows));
  }
  if (!LowerHex(request.gpu_uuid(), 32)) {
    return absl::InvalidArgumentError("gpu_uuid must be 32 lowercase hex digits");
  }
  const std::string& boot = request.boot_id();
  if (boot.empty() || boot.size() > 64 ||
      std::any_of(boot.begin(), boot.end(), [](char c) { return c < 0x21 || c > 0x7e; })) {
    return absl::InvalidArgumentError("boot_id must be 1..64 printable characters");
  }
  return absl::OkStatus();
}

absl::Status CheckAttachResponse(const tandem::v1::MlpAttachResponse& response, int rows) {
  for (const auto& [name, bytes] :
       {std::pair<const char*, const std::string*>{"input_memory", &response.input_memory()},
        {"output_memory", &response.output_memory()},
        {"input_event", &response.input_event()},
        {"output_event", &response.output_event()}}) {
    if (bytes->size() != kIpcHandleBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " is ", bytes->size(), " bytes, not ", kIpcHandleBytes));
    }
  }
  if (!IpcDoorbell::ValidName(response.doorbell())) {
    return absl::InvalidArgumentError("doorbell is not a doorbell page's name");
  }
  if (response.max_rows() != static_cast<uint32_t>(rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_rows ", response.max_rows(), ", asked for ", rows));
  }
  return absl::OkStatus();
}

}  // namespace tandem::mlp
