#include "runtime/server/kv_layout_convert.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::server {

kvtransfer::KvLayout ToTransferLayout(const KvCacheLayout& layout) {
  kvtransfer::KvLayout out;
  out.num_layers = layout.num_layers;
  out.num_blocks = layout.num_blocks;
  out.block_size = layout.block_size;
  out.num_kv_heads = layout.num_kv_heads;
  out.head_dim = layout.head_dim;
  out.elem_bytes = layout.elem_bytes;
  out.block_bytes = layout.block_bytes;
  out.layer_stride = layout.layer_stride;
  out.kv_stride = layout.kv_stride;
  out.block_stride = layout.block_stride;
  // Runners hold all heads; the CPU runner's KV is float32, the CUDA runner's bfloat16.
  out.dtype = layout.elem_bytes == 4   ? kvtransfer::KvDtype::kF32
              : layout.elem_bytes == 2 ? kvtransfer::KvDtype::kBf16
                                       : kvtransfer::KvDtype::kRaw;
  out.head_begin = 0;
  out.total_kv_heads = layout.num_kv_heads;
  return out;
}

void KvLayoutToProto(const kvtransfer::KvLayout& layout, v1::KvLayout* proto) {
  proto->set_num_layers(layout.num_layers);
  proto->set_num_blocks(layout.num_blocks);
  proto->set_block_size(layout.block_size);
  proto->set_num_kv_heads(layout.num_kv_heads);
  proto->set_head_dim(layout.head_dim);
  proto->set_elem_bytes(layout.elem_bytes);
  proto->set_block_bytes(layout.block_bytes);
  proto->set_layer_stride(layout.layer_stride);
  proto->set_kv_stride(layout.kv_stride);
  proto->set_block_stride(layout.block_stride);
  proto->set_dtype(static_cast<v1::KvDtype>(layout.dtype));
  proto->set_head_begin(layout.head_begin);
  proto->set_total_kv_heads(layout.total_kv_heads);
}

kvtransfer::KvLayout KvLayoutFromProto(const v1::KvLayout& proto) {
  kvtransfer::KvLayout out;
  out.num_layers = proto.num_layers();
  out.num_blocks = proto.num_blocks();
  out.block_size = proto.block_size();
  out.num_kv_heads = proto.num_kv_heads();
  out.head_dim = proto.head_dim();
  out.elem_bytes = proto.elem_bytes();
  out.block_bytes = proto.block_bytes();
  out.layer_stride = proto.layer_stride();
  out.kv_stride = proto.kv_stride();
  out.block_stride = proto.block_stride();
  // An enum value this build does not know stays out of range: ValidateKvLayout refuses it.
  out.dtype = static_cast<kvtransfer::KvDtype>(proto.dtype());
  out.head_begin = proto.head_begin();
  out.total_kv_heads = proto.total_kv_heads();
  return out;
}

void CompatibilityToProto(const ModelConfig& config, v1::KvCompatibility* proto) {
  proto->set_layout_version(kKvLayoutVersion);
  proto->set_num_layers(config.num_layers);
  proto->set_num_kv_heads(config.num_kv_heads);
  proto->set_head_dim(config.head_dim);
  proto->set_vocab_size(config.vocab_size);
  proto->set_rope_theta(config.rope_theta);
  proto->set_hidden_size(config.hidden_size);
  proto->set_model_fingerprint(config.fingerprint);
  const RopeScaling& r = config.rope_scaling;
  proto->set_rope_scaling_kind(r.kind == RopeScaling::Kind::kLlama3 ? 1 : 0);
  if (r.kind != RopeScaling::Kind::kNone) {
    proto->set_rope_scaling_factor(r.factor);
    proto->set_rope_low_freq_factor(r.low_freq_factor);
    proto->set_rope_high_freq_factor(r.high_freq_factor);
    proto->set_rope_original_max_position(r.original_max_position_embeddings);
  }
}

absl::Status CheckCompatibility(const ModelConfig& config, const v1::KvCompatibility& theirs,
                                const std::string& who) {
  v1::KvCompatibility ours;
  CompatibilityToProto(config, &ours);
  const std::vector<std::pair<const char*, std::pair<double, double>>> fields = {
      {"layout_version", {theirs.layout_version(), ours.layout_version()}},
      {"num_layers", {theirs.num_layers(), ours.num_layers()}},
      {"num_kv_heads", {theirs.num_kv_heads(), ours.num_kv_heads()}},
      {"head_dim", {theirs.head_dim(), ours.head_dim()}},
      {"vocab_size", {theirs.vocab_size(), ours.vocab_size()}},
      {"rope_theta", {theirs.rope_theta(), ours.rope_theta()}},
      {"hidden_size", {theirs.hidden_size(), ours.hidden_size()}},
      {"rope_scaling kind", {theirs.rope_scaling_kind(), ours.rope_scaling_kind()}},
      {"rope_scaling factor", {theirs.rope_scaling_factor(), ours.rope_scaling_factor()}},
      {"rope_scaling low_freq_factor",
       {theirs.rope_low_freq_factor(), ours.rope_low_freq_factor()}},
      {"rope_scaling high_freq_factor",
       {theirs.rope_high_freq_factor(), ours.rope_high_freq_factor()}},
      {"rope_scaling original_max_position_embeddings",
       {theirs.rope_original_max_position(), ours.rope_original_max_position()}},
  };
  for (const auto& [name, values] : fields) {
    if (values.first != values.second) {
      return absl::FailedPreconditionError(absl::StrCat("incompatible models: ", name, " is ",
                                                        values.first, " on ", who, " but ",
                                                        values.second, " here"));
    }
  }
  // Unknown on either side (a runner built in a test) is not compared.
  if (!theirs.model_fingerprint().empty() && !ours.model_fingerprint().empty() &&
      theirs.model_fingerprint() != ours.model_fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "incompatible models: weights fingerprint ", theirs.model_fingerprint(), " on ", who,
        " but ", ours.model_fingerprint(), " here (the pools run different checkpoints)"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::server
