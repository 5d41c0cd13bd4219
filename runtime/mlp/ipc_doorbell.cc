#include "runtime/mlp/ipc_doorbell.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::mlp {

constexpr char kPrefix[] = "/tandem-mlp-";
constexpr size_t kPrefixLength = sizeof(kPrefix) - 1;
constexpr size_t kHexDigits = 32;

// The shared page: the client's words, then the shard's, on their own cache lines.
struct IpcDoorbell::Page {
  alignas(64) std::atomic<uint32_t> request;  // the last call rung (futex word)
  std::atomic<int32_t> layer;
  std::atomic<int32_t> row_offset;
  std::atomic<int32_t> rows;
  alignas(64) std::atomic<uint32_t> done;  // the last call answered (futex word)
  std::atomic<int32_t> code;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

namespace {

constexpr size_t kPageBytes = 4096;

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

// Sleeps while *word == seen, for at most `timeout` (spurious wake-ups are fine).
void FutexWait(std::atomic<uint32_t>* word, uint32_t seen, absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

// Waits until *word != seen or `deadline`: spins for about 20 us first (an answer is usually a
// few microseconds away), then sleeps on the futex in slices of at most 100 ms.
bool WaitChange(std::atomic<uint32_t>* word, uint32_t seen, absl::Time deadline) {
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
  while (std::chrono::steady_clock::now() < spin_until) {
    if (word->load(std::memory_order_acquire) != seen) return true;
  }
  while (true) {
    if (word->load(std::memory_order_acquire) != seen) return true;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    FutexWait(word, seen, std::min(left, absl::Milliseconds(100)));
  }
}

}  // namespace

bool IpcDoorbell::ValidName(const std::string& name) {
  if (name.size() != kPrefixLength + kHexDigits || name.compare(0, kPrefixLength, kPrefix) != 0) {
    return false;
  }
  for (size_t i = kPrefixLength; i < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::StatusOr<IpcDoorbell> IpcDoorbell::Create() {
  static_assert(sizeof(Page) <= kPageBytes);
  std::random_device rd;
  std::string name = kPrefix;
  for (size_t i = 0; i < kHexDigits; ++i) name += "0123456789abcdef"[rd() % 16];
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("MLP doorbell: shm_open(", name, "): ", std::strerror(errno)));
  }
  void* p = MAP_FAILED;
  if (ftruncate(fd, kPageBytes) == 0) {
    p = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int saved = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return absl::UnavailableError(
        absl::StrCat("MLP doorbell: mapping ", name, ": ", std::strerror(saved)));
  }
  Page* page = new (p) Page{};  // zero-filled by ftruncate; constructed for the atomics
  return IpcDoorbell(std::move(name), page, /*owner=*/true);
}

absl::StatusOr<IpcDoorbell> IpcDoorbell::Open(const std::string& name) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MLP doorbell: \"", name, "\" is not a doorbell name (", kPrefix, "<hex>)"));
  }
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("MLP doorbell: shm_open(", name, "): ", std::strerror(errno),
                     " (the shard must run on this host, in this IPC namespace)"));
  }
  struct stat st = {};
  if (fstat(fd, &st) != 0 || st.st_size != static_cast<off_t>(kPageBytes)) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("MLP doorbell: ", name, " is not a ", kPageBytes, "-byte page"));
  }
  void* p = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int saved = errno;
  close(fd);
  if (p == MAP_FAILED) {
    return absl::UnavailableError(
        absl::StrCat("MLP doorbell: mapping ", name, ": ", std::strerror(saved)));
  }
  IpcDoorbell bell(name, static_cast<Page*>(p), /*owner=*/false);
  bell.next_seq_ = bell.page_->request.load(std::memory_order_acquire);
  return bell;
}

IpcDoorbell::IpcDoorbell(IpcDoorbell&& other) noexcept
    : name_(std::move(other.name_)),
      page_(std::exchange(other.page_, nullptr)),
      owner_(std::exchange(other.owner_, false)),
      next_seq_(other.next_seq_) {}

IpcDoorbell& IpcDoorbell::operator=(IpcDoorbell&& other) noexcept {
  if (this != &other) {
    Close();
    name_ = std::move(other.name_);
    page_ = std::exchange(other.page_, nullptr);
    owner_ = std::exchange(other.owner_, false);
    next_seq_ = other.next_seq_;
  }
  return *this;
}

IpcDoorbell::~IpcDoorbell() { Close(); }

void IpcDoorbell::Close() {
  if (page_ == nullptr) return;
  munmap(page_, kPageBytes);
  page_ = nullptr;
  if (owner_) shm_unlink(name_.c_str());
  owner_ = false;
}

uint32_t IpcDoorbell::Ring(int layer, int row_offset, int rows) {
  page_->layer.store(layer, std::memory_order_relaxed);
  page_->row_offset.store(row_offset, std::memory_order_relaxed);
  page_->rows.store(rows, std::memory_order_relaxed);
  const uint32_t seq = ++next_seq_;
  page_->request.store(seq, std::memory_order_release);
  FutexWake(&page_->request);
  return seq;
}

absl::StatusOr<int32_t> IpcDoorbell::WaitDone(uint32_t seq, absl::Time deadline) {
  while (true) {
    const uint32_t done = page_->done.load(std::memory_order_acquire);
    if (done == seq) return page_->code.load(std::memory_order_relaxed);
    if (!WaitChange(&page_->done, done, deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("the MLP shard did not take call ", seq, " in time"));
    }
  }
}

absl::StatusOr<IpcDoorbell::Request> IpcDoorbell::WaitRequest(absl::Time deadline) {
  const uint32_t seen = next_seq_;
  if (page_->request.load(std::memory_order_acquire) == seen &&
      !WaitChange(&page_->request, seen, deadline)) {
    return absl::DeadlineExceededError("no MLP call");
  }
  Request r;
  r.seq = page_->request.load(std::memory_order_acquire);
  r.layer = page_->layer.load(std::memory_order_relaxed);
  r.row_offset = page_->row_offset.load(std::memory_order_relaxed);
  r.rows = page_->rows.load(std::memory_order_relaxed);
  next_seq_ = r.seq;
  return r;
}

void IpcDoorbell::Finish(uint32_t seq, int32_t code) {
  page_->code.store(code, std::memory_order_relaxed);
  page_->done.store(seq, std::memory_order_release);
  FutexWake(&page_->done);
}

}  // namespace tandem::mlp
