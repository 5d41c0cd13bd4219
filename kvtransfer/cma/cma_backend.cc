#include "kvtransfer/cma/cma_backend.h"

#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "kvtransfer/cma/cma_wire.h"
#include "kvtransfer/copy_ops.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"

namespace tandem::kvtransfer {
namespace {

// The most one process_vm_writev call moves: bounds how long Release waits for a call in flight.
constexpr size_t kMaxCallBytes = size_t{16} << 20;
// A transfer is split over the copy threads only in shares of at least this.
constexpr uint64_t kMinShareBytes = uint64_t{1} << 20;
constexpr int kMaxThreads = 64;

// One contiguous piece of an op: our address, the peer's, and the length.
struct Segment {
  uintptr_t local = 0;
  uintptr_t remote = 0;
  size_t length = 0;
};

// A posted transfer, shared by the owning thread and the copy threads running its shares.
class Posted {
 public:
  Posted(pid_t pid, bool read, int shares) : pid_(pid), read_(read), shares_left_(shares) {
    if (shares == 0) finished_.Notify();
  }

  pid_t pid() const { return pid_; }
  bool read() const { return read_; }  // PostRead: the peer's bytes into ours
  bool Stopped() const {
    return cancelled_.load(std::memory_order_relaxed) || failed_.load(std::memory_order_relaxed);
  }
  void Cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  // Records the first failure (copy threads, or PostWrite before any share ran).
  void Fail(std::string why) {
    absl::MutexLock lock(&mu_);
    if (error_.empty()) error_ = std::move(why);
    failed_.store(true, std::memory_order_relaxed);
  }
  // A copy thread finished (or skipped) one share.
  void ShareDone() {
    if (shares_left_.fetch_sub(1, std::memory_order_acq_rel) == 1) finished_.Notify();
  }
  bool Finished() const { return shares_left_.load(std::memory_order_acquire) == 0; }
  bool Failed() const { return failed_.load(std::memory_order_acquire); }
  void WaitFinished() { finished_.WaitForNotification(); }
  std::string Error() {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  const pid_t pid_;
  const bool read_;
  std::atomic<int> shares_left_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> failed_{false};
  absl::Notification finished_;
  absl::Mutex mu_;
  std::string error_ ABSL_GUARDED_BY(mu_);
};

struct Share {
  std::shared_ptr<Posted> transfer;
  std::vector<Segment> segments;
};

std::string ErrnoText(int err) { return absl::StrCat(strerrordesc_np(err), " (errno ", err, ")"); }

// What a failed process_vm_* call on `pid` means, for a person.
std::string AccessError(int err, pid_t pid, std::string_view what) {
  switch (err) {
    case ESRCH:
      return absl::StrCat("cma: ", std::string(what), ": peer process ", pid, " is gone");
    case EPERM:
      return absl::StrCat("cma: ", std::string(what), ": not permitted to access process ", pid,
                          "'s memory (ptrace restrictions: both processes must run as one user "
                          "with /proc/sys/kernel/yama/ptrace_scope 0, or this one needs "
                          "CAP_SYS_PTRACE; containers need a shared pid namespace)");
    case EFAULT:
      return absl::StrCat("cma: ", std::string(what), ": an address is not mapped in process ", pid,
                          " or in this one (the peer unmapped its region?)");
    default:
      return absl::StrCat("cma: ", std::string(what), " with process ", pid, ": ", ErrnoText(err));
  }
}

// Moves the first `bytes` of iovecs[*first..n) out of the way (a partial write ended there).
void Advance(iovec* iovecs, int n, int* first, size_t bytes) {
  while (bytes > 0 && *first < n) {
    iovec& v = iovecs[*first];
    if (bytes >= v.iov_len) {
      bytes -= v.iov_len;
      ++*first;
    } else {
      v.iov_base = static_cast<char*>(v.iov_base) + bytes;
      v.iov_len -= bytes;
      bytes = 0;
    }
  }
}

// Copies the byte stream local[0..nl) describes into the one remote[0..nr) describes (the same
// total), or with `read` the other way, resuming after partial copies. Mutates the iovecs.
// Returns "" or why it failed.
std::string CopyAll(pid_t pid, bool read, iovec* local, int nl, iovec* remote, int nr) {
  int kl = 0, kr = 0;
  const char* what = read ? "process_vm_readv" : "process_vm_writev";
  while (kl < nl) {
    const unsigned long ln = static_cast<unsigned long>(nl - kl);
    const unsigned long rn = static_cast<unsigned long>(nr - kr);
    const ssize_t r = read ? process_vm_readv(pid, local + kl, ln, remote + kr, rn, 0)
                           : process_vm_writev(pid, local + kl, ln, remote + kr, rn, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return AccessError(errno, pid, what);
    }
    if (r == 0) return absl::StrCat("cma: ", what, " with process ", pid, " moved nothing");
    Advance(local, nl, &kl, static_cast<size_t>(r));
    Advance(remote, nr, &kr, static_cast<size_t>(r));
  }
  return "";
}

// Appends [base, base+len) to iovecs[0..*n), merged into the last one when adjacent.
void Append(iovec* iovecs, int* n, uintptr_t base, size_t len) {
  if (*n > 0) {
    iovec& last = iovecs[*n - 1];
    if (reinterpret_cast<uintptr_t>(last.iov_base) + last.iov_len == base) {
      last.iov_len += len;
      return;
    }
  }
  iovecs[(*n)++] = {.iov_base = reinterpret_cast<void*>(base), .iov_len = len};
}

bool Adjacent(const iovec* iovecs, int n, uintptr_t base) {
  return n > 0 &&
         reinterpret_cast<uintptr_t>(iovecs[n - 1].iov_base) + iovecs[n - 1].iov_len == base;
}

// Runs one share: its segments in the order of their remote addresses (so that blocks landing
// next to each other become one remote iovec: the kernel pins the target's pages per remote
// iovec), in calls of at most IOV_MAX iovecs a side and kMaxCallBytes, stopping early once the
// transfer is cancelled or failed.
void RunShare(Share& share) {
  Posted& t = *share.transfer;
  std::vector<Segment>& segments = share.segments;
  std::sort(segments.begin(), segments.end(),
            [](const Segment& a, const Segment& b) { return a.remote < b.remote; });
  iovec local[IOV_MAX], remote[IOV_MAX];
  size_t next = 0, offset = 0;  // the first byte not yet written: segments[next] + offset
  while (next < segments.size() && !t.Stopped()) {
    int nl = 0, nr = 0;
    size_t bytes = 0;
    while (next < segments.size() && bytes < kMaxCallBytes) {
      const Segment& s = segments[next];
      const uintptr_t l = s.local + offset, r = s.remote + offset;
      if ((nl == IOV_MAX && !Adjacent(local, nl, l)) ||
          (nr == IOV_MAX && !Adjacent(remote, nr, r))) {
        break;
      }
      const size_t len = std::min(s.length - offset, kMaxCallBytes - bytes);
      Append(local, &nl, l, len);
      Append(remote, &nr, r, len);
      bytes += len;
      offset += len;
      if (offset == s.length) {
        ++next;
        offset = 0;
      }
    }
    std::string error = CopyAll(t.pid(), t.read(), local, nl, remote, nr);
    if (!error.empty()) t.Fail(std::move(error));
  }
  t.ShareDone();
}

// The copy threads: run shares in the order they were submitted.
class CopyPool {
 public:
  explicit CopyPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  // Runs what is queued, then joins.
  ~CopyPool() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& t : threads_) t.join();
  }

  void Submit(std::vector<Share> shares) {
    absl::MutexLock lock(&mu_);
    for (Share& s : shares) queue_.push_back(std::move(s));
  }

 private:
  void Loop() {
    while (true) {
      Share share;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;
        share = std::move(queue_.front());
        queue_.pop_front();
      }
      RunShare(share);
    }
  }

  absl::Mutex mu_;
  std::deque<Share> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Reads the 16 bytes at the peer's claimed nonce address out of its claimed pid and compares.
absl::Status CheckNonce(const cma::AgentAddress& peer) {
  cma::Nonce seen{};
  iovec local{.iov_base = seen.data(), .iov_len = seen.size()};
  iovec remote{.iov_base = reinterpret_cast<void*>(peer.nonce_address), .iov_len = seen.size()};
  const pid_t pid = static_cast<pid_t>(peer.pid);
  ssize_t r;
  do {
    r = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    const int err = errno;
    if (err == ESRCH) return absl::UnavailableError(AccessError(err, pid, "reading the nonce"));
    if (err == EFAULT) {
      return absl::FailedPreconditionError(
          absl::StrCat("cma: process ", pid, " has no identity nonce at ", peer.nonce_address,
                       ": it is not the peer (forged or stale address)"));
    }
    return absl::FailedPreconditionError(AccessError(err, pid, "reading the nonce"));
  }
  if (static_cast<size_t>(r) != seen.size() || seen != peer.nonce) {
    return absl::FailedPreconditionError(
        absl::StrCat("cma: process ", pid,
                     " does not hold the peer's identity nonce: it is not the peer (forged "
                     "address, or the peer is gone and its pid reused)"));
  }
  return absl::OkStatus();
}

struct Region {
  void* base = nullptr;
  size_t length = 0;
};

struct Peer {
  std::string address;
  cma::AgentAddress parsed;
};

struct Transfer {
  uint64_t local_region = 0;
  std::string peer;
  std::shared_ptr<Posted> posted;
  bool failure_logged = false;
};

class CmaBackend final : public TransferBackend {
 public:
  CmaBackend(const BackendOptions& options, std::string boot_id, uint64_t start_time,
             std::unique_ptr<cma::Nonce> nonce)
      : options_(options),
        boot_id_(std::move(boot_id)),
        start_time_(start_time),
        nonce_(std::move(nonce)),
        pool_(std::make_unique<CopyPool>(options.cma_threads)) {}

  ~CmaBackend() override {
    for (auto& [handle, transfer] : transfers_) {
      transfer.posted->Cancel();
      transfer.posted->WaitFinished();
    }
    pool_.reset();
    // A peer holding our address must not find the nonce in freed memory.
    explicit_bzero(nonce_->data(), nonce_->size());
  }

  std::string_view name() const override { return "cma"; }
  Capabilities capabilities() const override {
    return Capabilities{.host_memory = true,
                        .cuda_memory = false,
                        .notifications = false,
                        .read = true,
                        .cross_process = true};
  }
  const std::string& agent_name() const override { return options_.agent_name; }

  absl::StatusOr<std::string> LocalAddress() override {
    return cma::EncodeAgentAddress({.boot_id = boot_id_,
                                    .pid = static_cast<uint32_t>(getpid()),
                                    .start_time = start_time_,
                                    .nonce_address = reinterpret_cast<uintptr_t>(nonce_->data()),
                                    .nonce = *nonce_});
  }

  absl::StatusOr<MemoryRegion> RegisterMemory(void* base, size_t length, MemoryKind kind) override {
    switch (kind) {
      case MemoryKind::kHost:
        break;
      case MemoryKind::kCuda:
        return absl::InvalidArgumentError(
            "cma: only host memory can be registered (process_vm_writev cannot reach device "
            "memory; use cuda_ipc or nccl for a KV cache on a GPU)");
    }
    if (base == nullptr || length == 0) {
      return absl::InvalidArgumentError("cma: cannot register an empty region");
    }
    if (reinterpret_cast<uintptr_t>(base) > UINTPTR_MAX - length) {
      return absl::InvalidArgumentError("cma: region wraps around the address space");
    }
    const uint64_t id = next_region_id_++;
    regions_[id] = Region{base, length};
    return MemoryRegion{.id = id, .kind = kind, .base = base, .length = length};
  }

  absl::StatusOr<std::string> ExportRegion(uint64_t region_id) override {
    ASSIGN_OR_RETURN(const Region* region, FindRegion(region_id));
    return cma::EncodeRegionBlob({.id = region_id,
                                  .base = reinterpret_cast<uintptr_t>(region->base),
                                  .length = region->length});
  }

  absl::Status DeregisterMemory(uint64_t region_id) override {
    RETURN_IF_ERROR(FindRegion(region_id).status());
    for (const auto& [handle, transfer] : transfers_) {
      if (transfer.local_region == region_id) {
        return absl::FailedPreconditionError(
            absl::StrCat("cma: region ", region_id, " is used by unreleased transfer ", handle));
      }
    }
    regions_.erase(region_id);
    return absl::OkStatus();
  }

  absl::Status Connect(const std::string& peer, const std::string& address) override {
    auto it = peers_.find(peer);
    if (it != peers_.end() && it->second.address == address) return absl::OkStatus();
    ASSIGN_OR_RETURN(cma::AgentAddress parsed, cma::DecodeAgentAddress(address));
    if (boot_id_.empty() || parsed.boot_id != boot_id_) {
      return absl::FailedPreconditionError(
          absl::StrCat("cma: peer '", peer, "' runs on another host (boot id ", parsed.boot_id,
                       ", ours ", boot_id_, "): cma needs both processes on one host"));
    }
    const pid_t pid = static_cast<pid_t>(parsed.pid);
    absl::StatusOr<uint64_t> start = cma::ReadProcessStartTime(pid);
    if (absl::IsNotFound(start.status())) {
      return absl::UnavailableError(
          absl::StrCat("cma: peer '", peer, "' claims pid ", pid,
                       ", which does not run here (the peer is gone, or it lives in another pid "
                       "namespace: containers need a shared pid namespace)"));
    }
    RETURN_IF_ERROR(start.status());
    if (*start != parsed.start_time) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cma: peer '", peer, "' claims pid ", pid, " started at ", parsed.start_time,
          ", but that pid started at ", *start,
          ": another process (forged address, or the peer is gone and its pid reused)"));
    }
    absl::Status proved = CheckNonce(parsed);
    if (!proved.ok()) {
      return absl::Status(proved.code(),
                          absl::StrCat("connecting to '", peer, "': ", proved.message()));
    }
    if (it != peers_.end()) {
      if (UsedByTransfers(peer)) {
        return absl::FailedPreconditionError(
            absl::StrCat("cma: peer '", peer, "' has unreleased transfers; cannot reconnect"));
      }
      peers_.erase(it);
    }
    peers_.emplace(peer, Peer{.address = address, .parsed = std::move(parsed)});
    return absl::OkStatus();
  }

  absl::Status Disconnect(const std::string& peer) override {
    if (!peers_.contains(peer)) {
      return absl::NotFoundError(absl::StrCat("cma: not connected to '", peer, "'"));
    }
    if (UsedByTransfers(peer)) {
      return absl::FailedPreconditionError(
          absl::StrCat("cma: peer '", peer, "' has unreleased transfers"));
    }
    peers_.erase(peer);
    return absl::OkStatus();
  }

  absl::StatusOr<TransferHandle> PostWrite(const TransferRequest& request) override {
    return Post(request, /*read=*/false);
  }
  absl::StatusOr<TransferHandle> PostRead(const TransferRequest& request) override {
    return Post(request, /*read=*/true);
  }

  absl::StatusOr<TransferHandle> Post(const TransferRequest& request, bool read) {
    ASSIGN_OR_RETURN(const Region* local, FindRegion(request.local_region));
    auto peer_it = peers_.find(request.peer);
    if (peer_it == peers_.end()) {
      return absl::NotFoundError(absl::StrCat("cma: not connected to '", request.peer, "'"));
    }
    const cma::AgentAddress& peer = peer_it->second.parsed;
    if (!request.notification.empty()) {
      return absl::InvalidArgumentError(
          "cma: notifications are not supported (capabilities().notifications is false)");
    }
    ASSIGN_OR_RETURN(cma::RegionBlob remote, cma::DecodeRegionBlob(request.remote_region));
    RETURN_IF_ERROR(CheckOpsInRegions("cma", request.ops, local->length, remote.length));
    uint64_t total = 0;
    for (const CopyOp& op : request.ops) {
      if (op.length > UINT64_MAX - total) {
        return absl::InvalidArgumentError("cma: the ops' lengths overflow");
      }
      total += op.length;
    }
    std::vector<Share> shares =
        Split(request.ops, total, reinterpret_cast<uintptr_t>(local->base), remote.base);
    auto posted = std::make_shared<Posted>(static_cast<pid_t>(peer.pid), read,
                                           static_cast<int>(shares.size()));
    // The pid must still be the peer: it may have died (and its pid been reused) since Connect.
    absl::Status alive = shares.empty() ? absl::OkStatus() : CheckNonce(peer);
    if (!alive.ok()) {
      posted->Fail(std::string(alive.message()));
      for (size_t i = 0; i < shares.size(); ++i) posted->ShareDone();
    } else {
      for (Share& s : shares) s.transfer = posted;
      pool_->Submit(std::move(shares));
    }
    const TransferHandle handle = next_handle_++;
    transfers_.emplace(handle, Transfer{.local_region = request.local_region,
                                        .peer = request.peer,
                                        .posted = std::move(posted)});
    return handle;
  }

  absl::StatusOr<TransferState> Poll(TransferHandle handle) override {
    auto it = transfers_.find(handle);
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("cma: unknown transfer handle ", handle));
    }
    Transfer& t = it->second;
    if (!t.posted->Finished()) return TransferState::kInProgress;
    if (!t.posted->Failed()) return TransferState::kDone;
    if (!t.failure_logged) {
      t.failure_logged = true;
      LOG(WARNING) << "cma: transfer " << handle << " to '" << t.peer
                   << "' failed: " << t.posted->Error();
    }
    return TransferState::kFailed;
  }

  absl::Status Release(TransferHandle handle) override {
    auto it = transfers_.find(handle);
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("cma: unknown transfer handle ", handle));
    }
    // Shares not started are skipped; a call in flight finishes (at most kMaxCallBytes).
    it->second.posted->Cancel();
    it->second.posted->WaitFinished();
    transfers_.erase(it);
    return absl::OkStatus();
  }

  void Progress() override {}
  std::vector<Notification> GetNotifications() override { return {}; }

 private:
  absl::StatusOr<const Region*> FindRegion(uint64_t region_id) const {
    auto it = regions_.find(region_id);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("cma: unknown local region ", region_id));
    }
    return &it->second;
  }

  bool UsedByTransfers(const std::string& peer) const {
    for (const auto& [handle, transfer] : transfers_) {
      if (transfer.peer == peer) return true;
    }
    return false;
  }

  // The ops (checked, `total` bytes) as up to cma_threads shares of about equal bytes, each at
  // least kMinShareBytes; an op straddling two shares is split between them.
  std::vector<Share> Split(const std::vector<CopyOp>& ops, uint64_t total, uintptr_t local_base,
                           uintptr_t remote_base) const {
    std::vector<Share> shares;
    if (total == 0) return shares;
    const uint64_t count = std::clamp<uint64_t>(total / kMinShareBytes, 1,
                                                static_cast<uint64_t>(options_.cma_threads));
    const uint64_t per_share = (total + count - 1) / count;
    shares.resize(count);
    size_t current = 0;
    uint64_t room = per_share;  // bytes the current share still takes
    for (const CopyOp& op : ops) {
      uint64_t done = 0;
      while (done < op.length) {
        if (room == 0) {
          ++current;
          room = per_share;
        }
        const uint64_t len = std::min<uint64_t>(op.length - done, room);
        shares[current].segments.push_back({.local = local_base + op.local_offset + done,
                                            .remote = remote_base + op.remote_offset + done,
                                            .length = len});
        done += len;
        room -= len;
      }
    }
    shares.resize(current + 1);
    return shares;
  }

  const BackendOptions options_;
  const std::string boot_id_;
  const uint64_t start_time_;
  const std::unique_ptr<cma::Nonce> nonce_;  // its address is in LocalAddress
  std::unique_ptr<CopyPool> pool_;
  uint64_t next_region_id_ = 1;
  TransferHandle next_handle_ = 1;
  absl::flat_hash_map<uint64_t, Region> regions_;
  absl::flat_hash_map<std::string, Peer> peers_;
  absl::flat_hash_map<TransferHandle, Transfer> transfers_;
};

absl::StatusOr<cma::Nonce> RandomNonce() {
  cma::Nonce nonce{};
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError("cma: cannot open /dev/urandom");
  size_t got = 0;
  while (got < nonce.size()) {
    const ssize_t r = read(fd, nonce.data() + got, nonce.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  close(fd);
  if (got != nonce.size()) return absl::UnavailableError("cma: cannot read /dev/urandom");
  return nonce;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TransferBackend>> CreateCmaBackend(const BackendOptions& options) {
  if (options.cma_threads < 1 || options.cma_threads > kMaxThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("cma: cma_threads must be 1..", kMaxThreads, ", not ", options.cma_threads));
  }
  std::string boot_id = cma::ReadBootId();
  if (boot_id.empty()) {
    return absl::UnavailableError("cma: cannot read /proc/sys/kernel/random/boot_id");
  }
  absl::StatusOr<uint64_t> start = cma::ReadProcessStartTime(getpid());
  if (!start.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cma: cannot read this process's start time: ", start.status().message()));
  }
  ASSIGN_OR_RETURN(cma::Nonce nonce, RandomNonce());
  return std::unique_ptr<TransferBackend>(
      new CmaBackend(options, std::move(boot_id), *start, std::make_unique<cma::Nonce>(nonce)));
}

}  // namespace tandem::kvtransfer
