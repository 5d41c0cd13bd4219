#pragma once
// The nccl backend's blobs and messages, encoded, parsed and validated here with no CUDA or NCCL
// types (unit-tested without a GPU). Nothing parsed here is ever an address: peers name regions
// by id and offsets, which the receiving side checks against what it registered.
//
// Text blobs, versioned "nccl/1", fields separated by ';', every field required exactly once:
//   agent address (LocalAddress):  nccl/1;boot=<boot id>;host=<hostname>;gpu=<32 hex: GPU UUID>;
//                                  token=<32 hex: random per process>;staging=<max bytes>
//   connect reply (ConnectReply):  nccl/1;id=<256 hex: ncclUniqueId>;secret=<32 hex>;
//                                  token=<32 hex: the TARGET's token, echoed>
//   region (ExportRegion):         nccl/1;token=<32 hex>;region=<id>;length=<N>
// The token ties a reply or region to one process lifetime of the target (a restarted target
// refuses a stale reply). The secret is the pair's random 128-bit value, carried in every
// message header and ack and compared in constant time.
//
// Binary messages on the communicator (little-endian, fixed offsets):
//   header (initiator -> target, kHeaderBytes):
//     0 magic u32 'KVNH' | 4 version u16 | 6 reserved u16 (0) | 8 sequence u64 |
//     16 secret 16 B | 32 region u64 | 40 op_count u64 | 48 data_bytes u64 |
//     56 notification_bytes u32 | 60 flags u32 (0)
//   control (initiator -> target, op_count * kWireOpBytes + notification_bytes):
//     op_count x {remote_offset u64, length u64}, then the notification's bytes
//   data (initiator -> target, data_bytes): the ops' bytes back to back, in op order
//   ack (target -> initiator, kAckBytes):
//     0 magic u32 'KVNA' | 4 version u16 | 6 reserved u16 (0) | 8 sequence u64 | 16 secret 16 B
//
// Thread-safety: stateless functions.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::kvtransfer::nccl {

inline constexpr size_t kUuidBytes = 16;
inline constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
inline constexpr size_t kSecretBytes = 16;
inline constexpr size_t kHeaderBytes = 64;
inline constexpr size_t kAckBytes = 32;
inline constexpr size_t kWireOpBytes = 16;
inline constexpr uint32_t kHeaderMagic = 0x484e564b;  // "KVNH" little-endian
inline constexpr uint32_t kAckMagic = 0x414e564b;     // "KVNA" little-endian
inline constexpr uint16_t kWireVersion = 1;
// Bounds every target enforces on one message.
inline constexpr uint64_t kMaxOpsPerMessage = uint64_t{1} << 20;
inline constexpr uint32_t kMaxNotificationBytes = 64 * 1024;

using Uuid = std::array<uint8_t, kUuidBytes>;
using Token = std::array<uint8_t, kSecretBytes>;
using Secret = std::array<uint8_t, kSecretBytes>;
using UniqueId = std::array<uint8_t, kUniqueIdBytes>;

struct AgentAddress {
  std::string boot_id;  // /proc/sys/kernel/random/boot_id of the target's host
  std::string host;     // its hostname (for messages only)
  Uuid gpu{};
  Token token{};
  uint64_t staging_bytes = 0;  // the largest message data this target accepts
};

struct ConnectReply {
  UniqueId unique_id{};
  Secret secret{};
  Token target_token{};
};

struct RegionBlob {
  Token token{};
  uint64_t region = 0;
  uint64_t length = 0;
};

struct MessageHeader {
  uint64_t sequence = 0;
  Secret secret{};
  uint64_t region = 0;
  uint64_t op_count = 0;
  uint64_t data_bytes = 0;
  uint32_t notification_bytes = 0;
};

struct WireOp {
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

struct Ack {
  uint64_t sequence = 0;
  Secret secret{};
};

std::string EncodeAgentAddress(const AgentAddress& address);
// InvalidArgument, naming what is wrong, for anything but a well-formed version-1 blob.
absl::StatusOr<AgentAddress> DecodeAgentAddress(absl::string_view blob);
std::string EncodeConnectReply(const ConnectReply& reply);
absl::StatusOr<ConnectReply> DecodeConnectReply(absl::string_view blob);
std::string EncodeRegionBlob(const RegionBlob& region);
absl::StatusOr<RegionBlob> DecodeRegionBlob(absl::string_view blob);

std::string EncodeHeader(const MessageHeader& header);
// Checks only the framing (size, magic, version, reserved fields); what the fields mean is
// checked by the target's state machine (nccl_protocol.h).
absl::StatusOr<MessageHeader> DecodeHeader(absl::string_view bytes);
std::string EncodeAck(const Ack& ack);
absl::StatusOr<Ack> DecodeAck(absl::string_view bytes);
// The op list and notification of one message; `bytes` must be exactly op_count ops plus
// notification_bytes.
std::string EncodeControl(const std::vector<WireOp>& ops, absl::string_view notification);
absl::Status DecodeControl(absl::string_view bytes, uint64_t op_count, uint32_t notification_bytes,
                           std::vector<WireOp>* ops, std::string* notification);

// Constant-time equality of two secrets (or tokens).
bool SameSecret(const Secret& a, const Secret& b);
// 16 bytes from /dev/urandom; Unavailable when it cannot be read.
absl::StatusOr<Secret> RandomSecret();
// This host's boot id (trimmed), or "" when it cannot be read.
std::string ReadBootId();
std::string HexString(const uint8_t* bytes, size_t size);

}  // namespace tandem::kvtransfer::nccl
