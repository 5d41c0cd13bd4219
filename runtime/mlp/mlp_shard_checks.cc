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
  if (request.session() != 0) {
    // The rows are in the session's slot (the shard checks slot and rows against the session).
    if (!request.activations().empty()) {
      return absl::InvalidArgumentError(
          "activations: must be empty with a session (the rows are in its slot)");
    }
    return absl::OkStatus();
  }
  if (request.slot() != 0) {
    return absl::InvalidArgumentError("slot: set without a session");
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
        {"flags", &response.flags()}}) {
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

namespace {

// 1..max bytes of printable ASCII.
bool Printable(const std::string& s, size_t max) {
  return !s.empty() && s.size() <= max &&
         std::none_of(s.begin(), s.end(), [](char c) { return c < 0x21 || c > 0x7e; });
}

}  // namespace

absl::Status CheckHostAttachRequest(const tandem::v1::MlpHostAttachRequest& request, int max_rows) {
  if (request.backend() != "cma" && request.backend() != "ucx") {
    return absl::InvalidArgumentError("backend: must be \"cma\" or \"ucx\"");
  }
  if (!Printable(request.agent(), kMaxAgentBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("agent: must be 1..", kMaxAgentBytes, " printable characters"));
  }
  for (const auto& [name, bytes] :
       {std::pair<const char*, const std::string*>{"address", &request.address()},
        {"input_region", &request.input_region()}}) {
    if (bytes->empty() || bytes->size() > kMaxBlobBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", bytes->size(), " bytes, not 1..", kMaxBlobBytes));
    }
  }
  if (request.slots() < 1 || request.slots() > kMaxHostSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots: ", request.slots(), " is not in 1..", kMaxHostSlots));
  }
  if (request.slot_rows() < 1 || request.slot_rows() > static_cast<uint32_t>(max_rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot_rows: ", request.slot_rows(), " is not in 1..", max_rows));
  }
  return absl::OkStatus();
}

absl::Status CheckHostAttachResponse(const tandem::v1::MlpHostAttachResponse& response) {
  if (response.session() == 0) return absl::InvalidArgumentError("session: 0");
  if (!Printable(response.agent(), kMaxAgentBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("agent: must be 1..", kMaxAgentBytes, " printable characters"));
  }
  for (const auto& [name, bytes] :
       {std::pair<const char*, const std::string*>{"address", &response.address()},
        {"output_region", &response.output_region()}}) {
    if (bytes->empty() || bytes->size() > kMaxBlobBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", bytes->size(), " bytes, not 1..", kMaxBlobBytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::mlp
