#pragma once
// KV layout conversions at the service edge: the runner's KvCacheLayout and the planner's
// kvtransfer::KvLayout to and from proto tandem.v1.KvLayout (all three use the same offsets).
//
// Pure functions, thread-safe. KvLayoutFromProto only maps; kvtransfer::ValidateKvLayout and
// PlanBlockCopies judge the values.

#include "kvtransfer/kv_layout.h"
#include "runtime/model/model_runner.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::server {

// The version of KvLayout's offset formula (proto tandem.v1.KvCompatibility.layout_version).
inline constexpr int kKvLayoutVersion = 1;

// What a pair handshake compares (v1.KvCompatibility) for `config`.
void CompatibilityToProto(const ModelConfig& config, v1::KvCompatibility* proto);

kvtransfer::KvLayout ToTransferLayout(const KvCacheLayout& layout);
void KvLayoutToProto(const kvtransfer::KvLayout& layout, v1::KvLayout* proto);
kvtransfer::KvLayout KvLayoutFromProto(const v1::KvLayout& proto);

}  // namespace tandem::server
