#pragma once
// A model's fingerprint: what two workers compare in the KV pair handshake so a decode worker
// never decodes on KV another model computed (v1.KvCompatibility.model_fingerprint). It hashes
// every tensor's name, dtype and shape and a sample of its bytes (the first, middle and last
// 256 bytes), so two random models of the same shape differ while loading the same directory on
// a CPU and a GPU worker agrees. Not a cryptographic digest: peers are authenticated elsewhere;
// this catches operator mistakes (two pools started on different checkpoints).
//
// Pure function of the store's contents; thread-safe.

#include <string>

#include "runtime/model/safetensors.h"

namespace tandem {

// 16 hex digits (64-bit FNV-1a). Reads at most 768 bytes of each tensor.
std::string ModelFingerprint(const TensorStore& store);

}  // namespace tandem
