#include "kvtransfer/ucx/ucx_backend.h"

#include <signal.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer {
namespace {

constexpr unsigned kNotifyAmId = 0x7d;
constexpr uint32_t kRegionMagic = 0x314b5254;  // "TRK1"
// Longest a bounded internal wait (endpoint close, draining released requests) may take.
constexpr absl::Duration kDrainTimeout = absl::Milliseconds(200);

// ucs_status_t -> absl::Status, keeping UCX's message.
absl::Status UcsError(ucs_status_t status, std::string_view what) {
  const std::string message =
      absl::StrCat("ucx: ", std::string(what), ": ", ucs_status_string(status));
  switch (status) {
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(message);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return absl::InvalidArgumentError(message);
    case UCS_ERR_TIMED_OUT:
      return absl::DeadlineExceededError(message);
    case UCS_ERR_CANCELED:
      return absl::CancelledError(message);
    default:
      return absl::UnavailableError(message);
  }
}

// Region blob: header followed by the packed rkey.
struct RegionBlobHeader {
  uint32_t magic;
  uint32_t rkey_length;
  uint64_t base;
  uint64_t length;
};

struct RemoteKey {
  ucp_rkey_h rkey = nullptr;
  uint64_t base = 0;
  uint64_t length = 0;
};

struct Peer {
  std::string name;
  std::string address;
  std::string ucx_address;  // UCX's part of `address`
  ucp_ep_h ep = nullptr;
  // Same host over shared memory (no UCX peer error handling, which would drop the shared-memory
  // transports): the peer's death is seen by its pid instead.
  pid_t pid = 0;
  absl::Time next_liveness_check;
  bool failed = false;
  ucs_status_t error = UCS_OK;
  absl::flat_hash_map<std::string, RemoteKey> rkeys;  // by region blob
};

struct Region {
  void* base = nullptr;
  size_t length = 0;
  ucp_mem_h memh = nullptr;
};

enum class Stage { kData, kNotify, kDone, kFailed };

struct Transfer {
  TransferHandle handle = 0;  // 0 until posted
  uint64_t local_region = 0;
  std::string peer;
  std::vector<void*> requests;  // outstanding put/get/flush requests
  void* notify_request = nullptr;
  std::string notify_payload;  // must outlive notify_request
  Stage stage = Stage::kData;
  absl::Status error;

  bool HasRequests() const { return !requests.empty() || notify_request != nullptr; }
};

// Sees whether `request` (a ucp request pointer) finished; frees it if so.
// Returns UCS_INPROGRESS while pending, otherwise its final status.
ucs_status_t CheckAndFree(void* request) {
  const ucs_status_t status = ucp_request_check_status(request);
  if (status != UCS_INPROGRESS) ucp_request_free(request);
  return status;
}

// Handles the result of an nbx call: an error pointer, nullptr (done at once) or a request.
ucs_status_t Track(ucs_status_ptr_t result, std::vector<void*>& requests) {
  if (UCS_PTR_IS_ERR(result)) return UCS_PTR_STATUS(result);
  if (result != nullptr) requests.push_back(result);
  return UCS_OK;
}

constexpr char kAddressMagic[] = "tandem-ucx/1";

std::string ReadBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id.size() == 36 ? id : std::string();
}

struct ParsedAddress {
  std::string boot_id;
  pid_t pid = 0;
  std::string ucx;  // UCX's worker address
};

// The header LocalAddress puts before UCX's address; InvalidArgument for anything else.
absl::StatusOr<ParsedAddress> ParseAddress(const std::string& blob) {
  const size_t nl = blob.find('\n');
  if (nl == std::string::npos || nl > 128 ||
      blob.compare(0, std::strlen(kAddressMagic), kAddressMagic) != 0) {
    return absl::InvalidArgumentError("ucx: the peer address is not a tandem-ucx/1 address");
  }
  const std::string header = blob.substr(0, nl);
  const size_t a = header.find(' '), b = header.rfind(' ');
  ParsedAddress p;
  long pid = 0;
  if (a == std::string::npos || b == a) {
    return absl::InvalidArgumentError("ucx: malformed peer address header");
  }
  p.boot_id = header.substr(a + 1, b - a - 1);
  char* end = nullptr;
  pid = std::strtol(header.c_str() + b + 1, &end, 10);
  if (end == nullptr || *end != '\0' || pid <= 0 || pid > (1L << 22)) {
    return absl::InvalidArgumentError("ucx: malformed peer pid");
  }
  p.pid = static_cast<pid_t>(pid);
  p.ucx = blob.substr(nl + 1);
  if (p.ucx.empty()) return absl::InvalidArgumentError("ucx: empty peer address");
  return p;
}

class UcxBackend final : public TransferBackend {
 public:
  explicit UcxBackend(const BackendOptions& options) : options_(options) {}

  ~UcxBackend() override {
    for (auto& [handle, transfer] : transfers_) {
      CancelRequests(*transfer);
      zombies_.push_back(std::move(transfer));
    }
    transfers_.clear();
    // Outstanding operations must finish before their rkeys and endpoints go (bounded wait).
    DrainUntil(absl::Now() + kDrainTimeout, [&] { return zombies_.empty(); });
    std::vector<std::string> names;
    for (const auto& [name, peer] : peers_) names.push_back(name);
    for (const std::string& name : names) ClosePeer(name);
    DrainUntil(absl::Now() + kDrainTimeout, [&] { return closing_.empty(); });
    for (auto& zombie : zombies_) {
      for (void* r : zombie->requests) ucp_request_free(r);
      if (zombie->notify_request != nullptr) ucp_request_free(zombie->notify_request);
    }
    for (void* request : pending_closes_) ucp_request_free(request);
    for (auto& [id, region] : regions_) ucp_mem_unmap(context_, region.memh);
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }

  absl::Status Init() {
    ucp_config_t* config = nullptr;
    ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
    if (status != UCS_OK) return UcsError(status, "ucp_config_read");
    if (!options_.ucx_transports.empty()) {
      status = ucp_config_modify(config, "TLS", options_.ucx_transports.c_str());
      if (status != UCS_OK) {
        ucp_config_release(config);
        return UcsError(status, absl::StrCat("transports '", options_.ucx_transports, "'"));
      }
    }
    if (!options_.ucx_net_devices.empty()) {
      status = ucp_config_modify(config, "NET_DEVICES", options_.ucx_net_devices.c_str());
      if (status != UCS_OK) {
        ucp_config_release(config);
        return UcsError(status, absl::StrCat("network devices '", options_.ucx_net_devices, "'"));
      }
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
    params.name = options_.agent_name.c_str();
    status = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (status != UCS_OK) return UcsError(status, "ucp_init");

    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
    status = ucp_worker_create(context_, &worker_params, &worker_);
    if (status != UCS_OK) return UcsError(status, "ucp_worker_create");

    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = kNotifyAmId;
    am.cb = &UcxBackend::OnNotification;
    am.arg = this;
    status = ucp_worker_set_am_recv_handler(worker_, &am);
    if (status != UCS_OK) return UcsError(status, "ucp_worker_set_am_recv_handler");

    ucp_address_t* address = nullptr;
    size_t address_length = 0;
    status = ucp_worker_get_address(worker_, &address, &address_length);
    if (status != UCS_OK) return UcsError(status, "ucp_worker_get_address");
    // "tandem-ucx/1 <boot id> <pid>\n" before UCX's worker address: a peer on the same host (same
    // boot id) may use shared memory without UCX's peer error handling (see Connect).
    boot_id_ = ReadBootId();
    address_ =
        absl::StrCat(kAddressMagic, " ", boot_id_.empty() ? "-" : boot_id_, " ", getpid(), "\n");
    address_.append(reinterpret_cast<const char*>(address), address_length);
    ucp_worker_release_address(worker_, address);
    return absl::OkStatus();
  }

  std::string_view name() const override { return "ucx"; }
  Capabilities capabilities() const override {
    return Capabilities{.host_memory = true,
                        .cuda_memory = false,
                        .notifications = true,
                        .read = true,
                        .cross_process = true};
  }
  const std::string& agent_name() const override { return options_.agent_name; }
  absl::StatusOr<std::string> LocalAddress() override { return address_; }

  absl::StatusOr<MemoryRegion> RegisterMemory(void* base, size_t length, MemoryKind kind) override {
    if (kind != MemoryKind::kHost) {
      return absl::InvalidArgumentError("ucx: this build registers host memory only");
    }
    if (base == nullptr || length == 0) {
      return absl::InvalidArgumentError("ucx: cannot register an empty region");
    }
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = base;
    params.length = length;
    ucp_mem_h memh = nullptr;
    const ucs_status_t status = ucp_mem_map(context_, &params, &memh);
    if (status != UCS_OK) return UcsError(status, absl::StrCat("ucp_mem_map ", length, " bytes"));
    const uint64_t id = next_region_id_++;
    regions_[id] = Region{base, length, memh};
    return MemoryRegion{.id = id, .kind = kind, .base = base, .length = length};
  }

  absl::StatusOr<std::string> ExportRegion(uint64_t region_id) override {
    ASSIGN_OR_RETURN(const Region* region, FindRegion(region_id));
    void* packed = nullptr;
    size_t packed_length = 0;
    const ucs_status_t status = ucp_rkey_pack(context_, region->memh, &packed, &packed_length);
    if (status != UCS_OK) return UcsError(status, "ucp_rkey_pack");
    RegionBlobHeader header{.magic = kRegionMagic,
                            .rkey_length = static_cast<uint32_t>(packed_length),
                            .base = reinterpret_cast<uintptr_t>(region->base),
                            .length = region->length};
    std::string blob(reinterpret_cast<const char*>(&header), sizeof(header));
    blob.append(static_cast<const char*>(packed), packed_length);
    ucp_rkey_buffer_release(packed);
    return blob;
  }

  absl::Status DeregisterMemory(uint64_t region_id) override {
    ASSIGN_OR_RETURN(const Region* region, FindRegion(region_id));
    for (const auto& [handle, transfer] : transfers_) {
      if (transfer->local_region == region_id) {
        return absl::FailedPreconditionError(
            absl::StrCat("ucx: region ", region_id, " is used by unreleased transfer ", handle));
      }
    }
    auto zombies_use_region = [&] {
      for (const auto& zombie : zombies_) {
        if (zombie->local_region == region_id) return true;
      }
      return false;
    };
    if (!DrainUntil(absl::Now() + kDrainTimeout, [&] { return !zombies_use_region(); })) {
      return absl::FailedPreconditionError(
          absl::StrCat("ucx: released transfers on region ", region_id, " are still in flight"));
    }
    const ucs_status_t status = ucp_mem_unmap(context_, region->memh);
    regions_.erase(region_id);
    if (status != UCS_OK) return UcsError(status, "ucp_mem_unmap");
    return absl::OkStatus();
  }

  absl::Status Connect(const std::string& peer_name, const std::string& address) override {
    ReapFailedPeers();
    auto it = peers_.find(peer_name);
    if (it != peers_.end()) {
      if (it->second->address == address && !it->second->failed) return absl::OkStatus();
      if (TransfersUsePeer(peer_name)) {
        return absl::FailedPreconditionError(
            absl::StrCat("ucx: peer '", peer_name, "' has unreleased transfers; cannot reconnect"));
      }
      ClosePeer(peer_name);
    }
    ASSIGN_OR_RETURN(ParsedAddress parsed, ParseAddress(address));
    auto peer = std::make_unique<Peer>();
    peer->name = peer_name;
    peer->address = address;
    peer->ucx_address = std::move(parsed.ucx);
    // UCX 1.13 drops its shared-memory transports from endpoints with peer error handling; on one
    // host (and with shared memory among the transports) go without it and watch the peer's pid.
    const bool same_host = !boot_id_.empty() && parsed.boot_id == boot_id_;
    if (same_host && SharedMemoryAllowed()) peer->pid = parsed.pid;
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(peer->ucx_address.data());
    params.err_mode = peer->pid > 0 ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &UcxBackend::OnEndpointError;
    params.err_handler.arg = peer.get();
    ucs_status_t status = ucp_ep_create(worker_, &params, &peer->ep);
    if (status != UCS_OK) {
      return UcsError(status, absl::StrCat("ucp_ep_create to '", peer_name, "'"));
    }
    Peer* raw = peer.get();
    peers_[peer_name] = std::move(peer);
    // Wait for wireup: a flush of the fresh endpoint completes once its lanes are connected.
    ucp_request_param_t flush_params{};
    std::vector<void*> requests;
    status = Track(ucp_ep_flush_nbx(raw->ep, &flush_params), requests);
    const absl::Time deadline = absl::Now() + options_.connect_timeout;
    if (status == UCS_OK && !requests.empty()) {
      DrainUntil(deadline, [&] {
        CheckLiveness(*raw);
        return ucp_request_check_status(requests[0]) != UCS_INPROGRESS || raw->failed;
      });
      status = ucp_request_check_status(requests[0]);
      if (status == UCS_INPROGRESS) {
        ucp_request_cancel(worker_, requests[0]);
        status = UCS_ERR_TIMED_OUT;
      }
      ucp_request_free(requests[0]);
    }
    if (status == UCS_OK && raw->failed) status = raw->error;
    if (status != UCS_OK) {
      ClosePeer(peer_name);
      return UcsError(status, absl::StrCat("connect to '", peer_name, "' (deadline ",
                                           absl::FormatDuration(options_.connect_timeout), ")"));
    }
    return absl::OkStatus();
  }

  absl::Status Disconnect(const std::string& peer_name) override {
    if (!peers_.contains(peer_name)) {
      return absl::NotFoundError(absl::StrCat("ucx: not connected to '", peer_name, "'"));
    }
    if (TransfersUsePeer(peer_name)) {
      return absl::FailedPreconditionError(
          absl::StrCat("ucx: peer '", peer_name, "' has unreleased transfers"));
    }
    ClosePeer(peer_name);
    DrainUntil(absl::Now() + kDrainTimeout, [&] { return closing_.empty(); });
    return absl::OkStatus();
  }

  absl::StatusOr<TransferHandle> PostWrite(const TransferRequest& request) override {
    return Post(request, /*write=*/true);
  }
  absl::StatusOr<TransferHandle> PostRead(const TransferRequest& request) override {
    return Post(request, /*write=*/false);
  }

  absl::StatusOr<TransferState> Poll(TransferHandle handle) override {
    auto it = transfers_.find(handle);
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("ucx: unknown transfer handle ", handle));
    }
    Progress();
    Transfer& t = *it->second;
    Advance(t);
    switch (t.stage) {
      case Stage::kData:
      case Stage::kNotify:
        return TransferState::kInProgress;
      case Stage::kDone:
        return TransferState::kDone;
      case Stage::kFailed:
        LOG(DEBUG) << "ucx transfer " << handle << " failed: " << t.error;
        return TransferState::kFailed;
    }
    return TransferState::kFailed;
  }

  absl::Status Release(TransferHandle handle) override {
    auto it = transfers_.find(handle);
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("ucx: unknown transfer handle ", handle));
    }
    std::unique_ptr<Transfer> transfer = std::move(it->second);
    transfers_.erase(it);
    if (transfer->HasRequests()) {
      CancelRequests(*transfer);
      zombies_.push_back(std::move(transfer));
    }
    return absl::OkStatus();
  }

  // A released transfer whose puts could not be recalled stays a zombie until they finish.
  bool Lingering(TransferHandle released) override {
    ReapZombies();
    for (const auto& zombie : zombies_) {
      if (zombie->handle == released) return true;
    }
    return false;
  }

  void Progress() override {
    for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) {
    }
    ReapZombies();
    ReapFailedPeers();
    ReapClosing();
  }

  std::vector<Notification> GetNotifications() override {
    Progress();
    std::vector<Notification> out(std::make_move_iterator(notifications_.begin()),
                                  std::make_move_iterator(notifications_.end()));
    notifications_.clear();
    return out;
  }

 private:
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* peer = static_cast<Peer*>(arg);
    peer->failed = true;
    peer->error = status;
  }

  // Notification payload: u32 name length, initiator name, message.
  static ucs_status_t OnNotification(void* arg, const void* header, size_t header_length,
                                     void* data, size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxBackend*>(arg);
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      LOG(WARNING) << "ucx: dropping a rendezvous notification (notifications are eager)";
      return UCS_OK;
    }
    uint32_t name_length = 0;
    if (length < sizeof(name_length)) return UCS_OK;
    std::memcpy(&name_length, data, sizeof(name_length));
    if (length - sizeof(name_length) < name_length) return UCS_OK;
    const char* bytes = static_cast<const char*>(data) + sizeof(name_length);
    self->notifications_.push_back(Notification{
        .peer = std::string(bytes, name_length),
        .message = std::string(bytes + name_length, length - sizeof(name_length) - name_length)});
    return UCS_OK;
  }

  absl::StatusOr<const Region*> FindRegion(uint64_t region_id) const {
    auto it = regions_.find(region_id);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("ucx: unknown local region ", region_id));
    }
    return &it->second;
  }

  bool TransfersUsePeer(const std::string& peer_name) const {
    for (const auto& [handle, transfer] : transfers_) {
      if (transfer->peer == peer_name) return true;
    }
    return false;
  }

  // Progresses until `done()` or the deadline; returns done().
  template <typename Done>
  bool DrainUntil(absl::Time deadline, Done done) {
    while (!done()) {
      if (absl::Now() >= deadline) return false;
      if (ucp_worker_progress(worker_) == 0) absl::SleepFor(absl::Microseconds(50));
      ReapZombies();
      ReapClosing();
    }
    return true;
  }

  absl::StatusOr<RemoteKey*> RemoteKeyFor(Peer& peer, const std::string& blob) {
    auto it = peer.rkeys.find(blob);
    if (it != peer.rkeys.end()) return &it->second;
    RegionBlobHeader header;
    if (blob.size() < sizeof(header)) {
      return absl::InvalidArgumentError("ucx: malformed remote region blob (short)");
    }
    std::memcpy(&header, blob.data(), sizeof(header));
    if (header.magic != kRegionMagic || blob.size() != sizeof(header) + header.rkey_length) {
      return absl::InvalidArgumentError("ucx: malformed remote region blob");
    }
    RemoteKey key{.base = header.base, .length = header.length};
    const ucs_status_t status =
        ucp_ep_rkey_unpack(peer.ep, blob.data() + sizeof(header), &key.rkey);
    if (status != UCS_OK) return UcsError(status, "ucp_ep_rkey_unpack");
    return &(peer.rkeys[blob] = key);
  }

  absl::StatusOr<TransferHandle> Post(const TransferRequest& request, bool write) {
    ASSIGN_OR_RETURN(const Region* local, FindRegion(request.local_region));
    ReapFailedPeers();
    auto peer_it = peers_.find(request.peer);
    if (peer_it == peers_.end()) {
      return absl::NotFoundError(absl::StrCat("ucx: not connected to '", request.peer, "'"));
    }
    Peer& peer = *peer_it->second;
    if (peer.failed) return UcsError(peer.error, absl::StrCat("peer '", peer.name, "'"));
    ASSIGN_OR_RETURN(RemoteKey * remote, RemoteKeyFor(peer, request.remote_region));
    for (size_t i = 0; i < request.ops.size(); ++i) {
      const CopyOp& op = request.ops[i];
      if (op.length > local->length || op.local_offset > local->length - op.length ||
          op.length > remote->length || op.remote_offset > remote->length - op.length) {
        return absl::InvalidArgumentError(
            absl::StrCat("ucx: op ", i, " (local ", op.local_offset, ", remote ", op.remote_offset,
                         ", length ", op.length, ") lies outside the regions (local ",
                         local->length, " bytes, remote ", remote->length, " bytes)"));
      }
    }
    auto transfer = std::make_unique<Transfer>();
    transfer->local_region = request.local_region;
    transfer->peer = request.peer;
    if (!request.notification.empty()) {
      const uint32_t name_length = static_cast<uint32_t>(options_.agent_name.size());
      transfer->notify_payload.assign(reinterpret_cast<const char*>(&name_length),
                                      sizeof(name_length));
      absl::StrAppend(&transfer->notify_payload, options_.agent_name, request.notification);
    }
    ucs_status_t status = UCS_OK;
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
    params.memh = local->memh;
    auto* local_base = static_cast<uint8_t*>(local->base);
    for (const CopyOp& op : request.ops) {
      if (op.length == 0) continue;
      void* local_ptr = local_base + op.local_offset;
      const uint64_t remote_ptr = remote->base + op.remote_offset;
      status = Track(
          write ? ucp_put_nbx(peer.ep, local_ptr, op.length, remote_ptr, remote->rkey, &params)
                : ucp_get_nbx(peer.ep, local_ptr, op.length, remote_ptr, remote->rkey, &params),
          transfer->requests);
      if (status != UCS_OK) break;
    }
    ucp_request_param_t flush_params{};
    if (status == UCS_OK)
      status = Track(ucp_ep_flush_nbx(peer.ep, &flush_params), transfer->requests);
    if (status != UCS_OK) {
      // Ops already issued cannot be recalled: keep them until they finish.
      CancelRequests(*transfer);
      if (transfer->HasRequests()) zombies_.push_back(std::move(transfer));
      return UcsError(status, write ? "ucp_put_nbx" : "ucp_get_nbx");
    }
    const TransferHandle handle = next_handle_++;
    transfer->handle = handle;
    transfers_[handle] = std::move(transfer);
    return handle;
  }

  void Fail(Transfer& t, absl::Status error) {
    t.stage = Stage::kFailed;
    t.error = std::move(error);
  }

  // Moves `t` forward as far as its finished requests allow.
  void Advance(Transfer& t) {
    auto peer_it = peers_.find(t.peer);
    Peer* peer = peer_it == peers_.end() ? nullptr : peer_it->second.get();
    if (peer != nullptr) CheckLiveness(*peer);
    if (t.stage == Stage::kData) {
      ucs_status_t first_error = UCS_OK;
      std::vector<void*> pending;
      for (void* r : t.requests) {
        const ucs_status_t status = CheckAndFree(r);
        if (status == UCS_INPROGRESS) {
          pending.push_back(r);
        } else if (status != UCS_OK && first_error == UCS_OK) {
          first_error = status;
        }
      }
      t.requests = std::move(pending);
      if (first_error != UCS_OK) {
        Fail(t, UcsError(first_error, "transfer"));
      } else if (peer == nullptr || peer->failed) {
        Fail(t, UcsError(peer == nullptr ? UCS_ERR_UNREACHABLE : peer->error,
                         absl::StrCat("peer '", t.peer, "'")));
      } else if (t.requests.empty()) {
        if (t.notify_payload.empty()) {
          t.stage = Stage::kDone;
        } else {
          ucp_request_param_t params{};
          params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
          params.flags = UCP_AM_SEND_FLAG_EAGER;
          ucs_status_ptr_t result =
              ucp_am_send_nbx(peer->ep, kNotifyAmId, nullptr, 0, t.notify_payload.data(),
                              t.notify_payload.size(), &params);
          if (UCS_PTR_IS_ERR(result)) {
            Fail(t, UcsError(UCS_PTR_STATUS(result), "notification send"));
          } else {
            t.notify_request = result;
            t.stage = Stage::kNotify;
          }
        }
      }
    }
    if (t.stage == Stage::kNotify) {
      ucs_status_t status = UCS_OK;
      if (t.notify_request != nullptr) {
        status = CheckAndFree(t.notify_request);
        if (status != UCS_INPROGRESS) t.notify_request = nullptr;
      }
      if (status == UCS_OK) {
        t.stage = Stage::kDone;
      } else if (status != UCS_INPROGRESS) {
        Fail(t, UcsError(status, "notification send"));
      } else if (peer == nullptr || peer->failed) {
        Fail(t, UcsError(peer == nullptr ? UCS_ERR_UNREACHABLE : peer->error,
                         absl::StrCat("peer '", t.peer, "'")));
      }
    }
  }

  void CancelRequests(Transfer& t) {
    for (void* r : t.requests) ucp_request_cancel(worker_, r);
    if (t.notify_request != nullptr) ucp_request_cancel(worker_, t.notify_request);
  }

  void ReapZombies() {
    for (size_t i = 0; i < zombies_.size();) {
      Transfer& z = *zombies_[i];
      // Without UCX error handling (a same-host peer) the requests of a transfer to a peer whose
      // process is gone never complete: once its endpoint is force-closed nothing progresses
      // them, so hand them back to UCX (freed whenever they finish) and drop the zombie.
      auto peer = peers_.find(z.peer);
      if (peer != peers_.end() && peer->second->pid > 0 && peer->second->failed &&
          peer->second->ep == nullptr) {
        for (void* r : z.requests) ucp_request_free(r);
        if (z.notify_request != nullptr) ucp_request_free(z.notify_request);
        z.requests.clear();
        z.notify_request = nullptr;
      }
      std::vector<void*> pending;
      for (void* r : z.requests) {
        if (CheckAndFree(r) == UCS_INPROGRESS) pending.push_back(r);
      }
      z.requests = std::move(pending);
      if (z.notify_request != nullptr && CheckAndFree(z.notify_request) != UCS_INPROGRESS) {
        z.notify_request = nullptr;
      }
      if (z.HasRequests()) {
        ++i;
      } else {
        zombies_.erase(zombies_.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
  }

  // A failed endpoint must be closed (forcibly); the Peer entry stays, marked failed, so that
  // transfers and Connect see the error, until Connect replaces it or Disconnect removes it.
  // A same-host peer without UCX error handling: dead once its pid is gone (checked at most every
  // 10 ms while a transfer to it waits).
  void CheckLiveness(Peer& peer) {
    if (peer.pid <= 0 || peer.failed) return;
    const absl::Time now = absl::Now();
    if (now < peer.next_liveness_check) return;
    peer.next_liveness_check = now + absl::Milliseconds(10);
    if (kill(peer.pid, 0) != 0 && errno == ESRCH) {
      peer.failed = true;
      peer.error = UCS_ERR_CONNECTION_RESET;
    }
  }

  // Whether the configured transports include a shared-memory one (UCX's default, "", does).
  bool SharedMemoryAllowed() const {
    const std::string& t = options_.ucx_transports;
    if (t.empty() || t == "all") return true;
    for (const char* name : {"sm", "shm", "posix", "sysv", "cma", "xpmem", "knem"}) {
      for (size_t at = t.find(name); at != std::string::npos; at = t.find(name, at + 1)) {
        const size_t end = at + std::strlen(name);
        if ((at == 0 || t[at - 1] == ',') && (end == t.size() || t[end] == ',')) return true;
      }
    }
    return false;
  }

  void ReapFailedPeers() {
    for (auto& [name, peer] : peers_) {
      if (peer->failed && peer->ep != nullptr) CloseEndpoint(*peer);
    }
  }

  // Destroys the peer's rkeys and starts a forced close of its endpoint.
  void CloseEndpoint(Peer& peer) {
    for (auto& [blob, key] : peer.rkeys) ucp_rkey_destroy(key.rkey);
    peer.rkeys.clear();
    if (peer.ep == nullptr) return;
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t result = ucp_ep_close_nbx(peer.ep, &params);
    peer.ep = nullptr;
    if (UCS_PTR_IS_PTR(result)) pending_closes_.push_back(result);
  }

  // UCX wants an rkey destroyed after the operations using it finished and before its endpoint
  // goes: released transfers to this peer get a bounded time to finish first (a forced close
  // cancels whatever is still outstanding).
  void ClosePeer(const std::string& peer_name) {
    if (!peers_.contains(peer_name)) return;
    DrainUntil(absl::Now() + kDrainTimeout, [&] {
      for (const auto& zombie : zombies_) {
        if (zombie->peer == peer_name) return false;
      }
      return true;
    });
    auto it = peers_.find(peer_name);
    CloseEndpoint(*it->second);
    // The endpoint's error callback may still fire until its close completes: keep the Peer.
    closing_.push_back(std::move(it->second));
    peers_.erase(it);
  }

  void ReapClosing() {
    for (size_t i = 0; i < pending_closes_.size();) {
      if (CheckAndFree(pending_closes_[i]) == UCS_INPROGRESS) {
        ++i;
      } else {
        pending_closes_.erase(pending_closes_.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    if (pending_closes_.empty()) closing_.clear();
  }

  const BackendOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  std::string boot_id_;
  uint64_t next_region_id_ = 1;
  TransferHandle next_handle_ = 1;
  absl::flat_hash_map<uint64_t, Region> regions_;
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_;
  absl::flat_hash_map<TransferHandle, std::unique_ptr<Transfer>> transfers_;
  std::vector<std::unique_ptr<Transfer>> zombies_;  // released, requests still in flight
  // Peers removed while endpoint closes are pending (their error callbacks may still fire).
  std::vector<std::unique_ptr<Peer>> closing_;
  std::vector<void*> pending_closes_;
  std::deque<Notification> notifications_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TransferBackend>> CreateUcxBackend(const BackendOptions& options) {
  if (options.agent_name.empty()) {
    return absl::InvalidArgumentError("ucx: agent name must be non-empty");
  }
  auto backend = std::make_unique<UcxBackend>(options);
  RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<TransferBackend>(std::move(backend));
}

}  // namespace tandem::kvtransfer
