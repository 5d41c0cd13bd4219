#include "kvtransfer/kv_checksum.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer {
namespace {

static_assert(std::endian::native == std::endian::little,
              "KvChecksum hashes host-order words; every supported host is little-endian");

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ULL;
constexpr uint64_t kMix2 = 0x94D049BB133111EBULL;

// One word into one lane. A bijection of `acc` for a fixed word and of `word` for a fixed acc
// (add, rotate, multiply by an odd constant), so a changed word always changes its lane, and the
// change survives every later round.
inline uint64_t Round(uint64_t acc, uint64_t word) {
  return std::rotl(acc + word * kPrime2, 31) * kPrime1;
}

// splitmix64's finalizer: a bijection in which every input bit reaches every output bit.
inline uint64_t Avalanche(uint64_t x) {
  x = (x ^ (x >> 30)) * kMix1;
  x = (x ^ (x >> 27)) * kMix2;
  return x ^ (x >> 31);
}

inline uint64_t Load(const uint8_t* p) {
  uint64_t word;
  std::memcpy(&word, p, sizeof(word));
  return word;
}

// A hash of one byte stream, fed in pieces: the result depends only on the concatenation, never
// on where the pieces were cut. Words go round-robin into four lanes (independent multiply
// chains, so the loop runs at memory speed); bytes short of a 32-byte stripe wait in `pending_`.
class StreamHash {
 public:
  void Update(const uint8_t* data, size_t n) {
    total_ += n;
    if (pending_bytes_ > 0) {
      const size_t take = std::min(n, kStripe - pending_bytes_);
      std::memcpy(pending_.data() + pending_bytes_, data, take);
      pending_bytes_ += take;
      data += take;
      n -= take;
      if (pending_bytes_ < kStripe) return;
      Stripes(pending_.data(), kStripe);
      pending_bytes_ = 0;
    }
    const size_t whole = n - n % kStripe;
    Stripes(data, whole);
    std::memcpy(pending_.data(), data + whole, n - whole);
    pending_bytes_ = n - whole;
  }

  // Every step is a bijection of the running value for fixed other inputs, so a change confined
  // to one lane or one leftover word always changes the result.
  uint64_t Finish(uint64_t fold) const {
    uint64_t h = Avalanche(lanes_[0]);
    for (int i = 1; i < 4; ++i) h = Avalanche(h ^ lanes_[i]);
    size_t at = 0;
    for (; at + 8 <= pending_bytes_; at += 8)
      h = Avalanche(h ^ Load(pending_.data() + at) * kPrime1);
    if (at < pending_bytes_) {
      uint64_t tail = 0;  // zero-padded; the length below tells the padding from zero bytes
      std::memcpy(&tail, pending_.data() + at, pending_bytes_ - at);
      h = Avalanche(h ^ tail * kPrime1);
    }
    h = Avalanche(h ^ total_);
    return Avalanche(h ^ fold);
  }

 private:
  static constexpr size_t kStripe = 32;

  void Stripes(const uint8_t* p, size_t n) {
    uint64_t a = lanes_[0], b = lanes_[1], c = lanes_[2], d = lanes_[3];
    for (const uint8_t* end = p + n; p != end; p += kStripe) {
      a = Round(a, Load(p));
      b = Round(b, Load(p + 8));
      c = Round(c, Load(p + 16));
      d = Round(d, Load(p + 24));
    }
    lanes_ = {a, b, c, d};
  }

  std::array<uint64_t, 4> lanes_ = {kPrime1 + kPrime2, kPrime2, 0, 0 - kPrime1};
  std::array<uint8_t, kStripe> pending_{};
  size_t pending_bytes_ = 0;
  uint64_t total_ = 0;
};

// False when the end of block `block` of layer `layer`'s V (the furthest byte of any block the
// range reads: offsets grow with layer, kv and block) lies past `memory_bytes`. The sum is that
// of KvBlockOffset, checked for wrapping so that a layout with absurd strides is refused.
bool BlocksFit(const KvLayout& l, int layer, int32_t block, size_t memory_bytes) {
  uint64_t layer_part, block_part, end;
  if (__builtin_mul_overflow(static_cast<uint64_t>(layer), l.layer_stride, &layer_part) ||
      __builtin_mul_overflow(static_cast<uint64_t>(block), l.block_stride, &block_part) ||
      __builtin_add_overflow(layer_part, l.kv_stride, &end) ||
      __builtin_add_overflow(end, block_part, &end) ||
      __builtin_add_overflow(end, l.block_bytes, &end)) {
    return false;
  }
  return end <= memory_bytes;
}

}  // namespace

absl::StatusOr<uint64_t> KvChecksum(const KvLayout& layout, const void* memory, size_t memory_bytes,
                                    std::span<const int32_t> block_ids, int token_begin,
                                    int token_end, int head_begin, int head_end, int layer_begin,
                                    int layer_end) {
  RETURN_IF_ERROR(ValidateKvLayout(layout));
  if (layer_begin < 0 || layer_begin >= layer_end || layer_end > layout.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("checksum layers [", layer_begin, ", ",
                                                   layer_end, ") outside [0, ", layout.num_layers,
                                                   ")"));
  }
  const int64_t held_end = static_cast<int64_t>(layout.head_begin) + layout.num_kv_heads;
  if (head_begin < layout.head_begin || head_begin >= head_end || head_end > held_end) {
    return absl::InvalidArgumentError(absl::StrCat("checksum heads [", head_begin, ", ", head_end,
                                                   ") outside the heads the layout holds [",
                                                   layout.head_begin, ", ", held_end, ")"));
  }
  if (token_begin < 0 || token_end < token_begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("checksum tokens [", token_begin, ", ", token_end, ") are not a range"));
  }
  const int bs = layout.block_size;
  const size_t needed = (static_cast<size_t>(token_end) + bs - 1) / bs;
  RETURN_IF_ERROR(CheckBlockIds(block_ids, needed, layout.num_blocks, "checksum"));
  if (token_end > token_begin) {
    const int32_t last_block = *std::max_element(
        block_ids.begin() + token_begin / bs, block_ids.begin() + static_cast<ptrdiff_t>(needed));
    if (memory == nullptr || !BlocksFit(layout, layer_end - 1, last_block, memory_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checksum: block ", last_block, " of layer ", layer_end - 1, " ends past the memory (",
          memory_bytes, " bytes", memory == nullptr ? ", null" : "", ")"));
    }
  }

  const uint64_t head_bytes =
      static_cast<uint64_t>(layout.head_dim) * static_cast<uint64_t>(layout.elem_bytes);
  const uint64_t row_pitch = static_cast<uint64_t>(layout.num_kv_heads) * head_bytes;
  const uint64_t run_bytes = static_cast<uint64_t>(head_end - head_begin) * head_bytes;
  const uint64_t head_skip = static_cast<uint64_t>(head_begin - layout.head_begin) * head_bytes;
  const auto* base = static_cast<const uint8_t*>(memory);
  StreamHash hash;
  for (int layer = layer_begin; layer < layer_end; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int t = token_begin; t < token_end;) {
        const int slot = t % bs;
        const int run = std::min(bs - slot, token_end - t);
        const uint8_t* p = base + KvBlockOffset(layout, layer, kv, block_ids[t / bs]) +
                           static_cast<uint64_t>(slot) * row_pitch + head_skip;
        if (run_bytes == row_pitch) {  // whole rows: the block's tokens are back to back
          hash.Update(p, static_cast<size_t>(run) * row_pitch);
        } else {
          for (int r = 0; r < run; ++r) hash.Update(p + r * row_pitch, run_bytes);
        }
        t += run;
      }
    }
  }
  uint64_t fold = 0;
  for (int64_t v : {int64_t{token_begin}, int64_t{token_end}, int64_t{head_begin},
                    int64_t{head_end}, int64_t{layer_begin}, int64_t{layer_end},
                    int64_t{layout.head_dim}, int64_t{layout.elem_bytes}}) {
    fold = Avalanche(fold ^ static_cast<uint64_t>(v) * kPrime2);
  }
  return hash.Finish(fold);
}

}  // namespace tandem::kvtransfer
