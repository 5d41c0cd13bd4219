#pragma once
// KV layout conversions at the service edge: the runner's KvCacheLayout and the planner's
// kvtransfer::KvLayout to and from proto tandem.v1.KvLayout (all three use the same offsets).
//
// Pure functions, thread-safe. KvLayoutFromProto only maps; kvtransfer::ValidateKvLayout and
// PlanBlockCopies judge the values.

#include <string>

#include "absl/status/status.h"
#include "kvtransfer/kv_layout.h"
#include "runtime/model/model_runner.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::server {

// The version of KvLayout's offset formula (proto tandem.v1.KvCompatibility.layout_version).
inline constexpr int kKvLayoutVersion = 1;

// What a pair handshake compares (v1.KvCompatibility) for `config`.
void CompatibilityToProto(const ModelConfig& config, v1::KvCompatibility* proto);
// FailedPrecondition naming the first field where `theirs` (from worker `who`) differs from
// `config`'s: layout version, layers, KV heads, head_dim, vocabulary, hidden size, RoPE theta and
// scaling, and the weights fingerprint when both sides know it.
absl::Status CheckCompatibility(const ModelConfig& config, const v1::KvCompatibility& theirs,
                                const std::string& who);

kvtransfer::KvLayout ToTransferLayout(const KvCacheLayout& layout);
void KvLayoutToProto(const kvtransfer::KvLayout& layout, v1::KvLayout* proto);
kvtransfer::KvLayout KvLayoutFromProto(const v1::KvLayout& proto);

}  // namespace tandem::server
