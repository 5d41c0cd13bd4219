#include "runtime/server/kv_layout_convert.h"

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
}

}  // namespace tandem::server
