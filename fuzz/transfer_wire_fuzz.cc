// The transfer backends' blobs from a peer: connect (agent address) and region blobs of cuda_ipc,
// cma and nccl, nccl's connect reply, and nccl's binary framing (message header, ack, op list);
// cma's /proc/<pid>/stat parser. (UCX's address and region blobs are parsed inside
// ucx_backend.cc next to ucp_ep_create / ucp_ep_rkey_unpack and loopback's inside its backend,
// so they are not separable; see docs/fuzzing.md.)
//
// Input: one selector byte, then the blob. Properties: no crash; what decodes re-encodes to
// something that decodes to the same value, byte for byte the input for the strict formats (cma
// blobs, nccl's binary framing); decoded values keep their documented bounds (a cma region's
// base + length does not overflow, cuda_ipc's offset + length does not, nccl lengths are
// positive).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_support.h"
#include "kvtransfer/cma/cma_wire.h"
#include "kvtransfer/cuda_ipc/ipc_wire.h"
#include "kvtransfer/nccl/nccl_wire.h"

namespace {

namespace cma = tandem::kvtransfer::cma;
namespace ipc = tandem::kvtransfer::cuda_ipc;
namespace nccl = tandem::kvtransfer::nccl;

uint64_t Le(absl::string_view s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const absl::string_view blob(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 11) {
    case 0: {
      auto a = ipc::DecodeAgentAddress(blob);
      if (!a.ok()) break;
      FUZZ_CHECK(a->pid != 0 && !a->boot_id.empty());
      auto b = ipc::DecodeAgentAddress(ipc::EncodeAgentAddress(*a));
      FUZZ_CHECK(b.ok() && b->boot_id == a->boot_id && b->pid == a->pid && b->gpu == a->gpu);
      break;
    }
    case 1: {
      auto r = ipc::DecodeRegionBlob(blob);
      if (!r.ok()) break;
      FUZZ_CHECK(r->length > 0 && r->offset <= UINT64_MAX - r->length);
      auto b = ipc::DecodeRegionBlob(ipc::EncodeRegionBlob(*r));
      FUZZ_CHECK(b.ok() && b->handle == r->handle && b->offset == r->offset &&
                 b->length == r->length && b->gpu == r->gpu);
      break;
    }
    case 2: {
      auto a = cma::DecodeAgentAddress(blob);
      if (!a.ok()) break;
      FUZZ_CHECK(a->pid >= 1 && a->pid <= (1u << 22));
      FUZZ_CHECK(cma::EncodeAgentAddress(*a) == blob);
      break;
    }
    case 3: {
      auto r = cma::DecodeRegionBlob(blob);
      if (!r.ok()) break;
      FUZZ_CHECK(r->length > 0 && r->base <= UINT64_MAX - r->length);
      FUZZ_CHECK(cma::EncodeRegionBlob(*r) == blob);
      break;
    }
    case 4: {
      (void)cma::ParseStatStartTime(blob);
      break;
    }
    case 5: {
      auto a = nccl::DecodeAgentAddress(blob);
      if (!a.ok()) break;
      FUZZ_CHECK(a->staging_bytes > 0);
      auto b = nccl::DecodeAgentAddress(nccl::EncodeAgentAddress(*a));
      FUZZ_CHECK(b.ok() && b->boot_id == a->boot_id && b->host == a->host && b->gpu == a->gpu &&
                 b->token == a->token && b->staging_bytes == a->staging_bytes);
      break;
    }
    case 6: {
      auto r = nccl::DecodeConnectReply(blob);
      if (!r.ok()) break;
      auto b = nccl::DecodeConnectReply(nccl::EncodeConnectReply(*r));
      FUZZ_CHECK(b.ok() && b->unique_id == r->unique_id && b->secret == r->secret &&
                 b->target_token == r->target_token);
      break;
    }
    case 7: {
      auto r = nccl::DecodeRegionBlob(blob);
      if (!r.ok()) break;
      FUZZ_CHECK(r->length > 0);
      auto b = nccl::DecodeRegionBlob(nccl::EncodeRegionBlob(*r));
      FUZZ_CHECK(b.ok() && b->token == r->token && b->region == r->region &&
                 b->length == r->length);
      break;
    }
    case 8: {
      auto h = nccl::DecodeHeader(blob);
      if (!h.ok()) break;
      FUZZ_CHECK(nccl::EncodeHeader(*h) == blob);
      break;
    }
    case 9: {
      auto a = nccl::DecodeAck(blob);
      if (!a.ok()) break;
      FUZZ_CHECK(nccl::EncodeAck(*a) == blob);
      break;
    }
    case 10: {
      // op_count (u32) and notification_bytes (u16) as a header would give them, then the list.
      if (blob.size() < 6) break;
      const uint64_t op_count = Le(blob, 0, 4);
      const uint32_t notification_bytes = static_cast<uint32_t>(Le(blob, 4, 2));
      std::vector<nccl::WireOp> ops;
      std::string notification;
      if (!nccl::DecodeControl(blob.substr(6), op_count, notification_bytes, &ops, &notification)
               .ok()) {
        break;
      }
      FUZZ_CHECK(ops.size() == op_count && notification.size() == notification_bytes);
      FUZZ_CHECK(nccl::EncodeControl(ops, notification) == blob.substr(6));
      break;
    }
  }
  return 0;
}
