#pragma once
// IpcDoorbell: the per-call signal of the MLP shard's GPU data plane on one host (docs/mlp.md,
// "cuda_ipc"). One page of POSIX shared memory between an attention worker (the client) and a
// `tandem mlp-shard` session: the client rings it with (layer, row offset, rows) after queueing
// its input copy and recording the input event; the shard answers once it has queued that layer
// behind the event (or refused it). The GPU work itself is ordered by CUDA IPC events, not by this
// page.
//
// Protocol: one call at a time per page. Ring() stores layer, row offset and rows, then the call's
// sequence number (release) and wakes a waiting shard (futex). The shard's WaitRequest() sees the
// new sequence (acquire), reads them, and Finish(seq, code) stores the answer code then the
// sequence in `done` (release) and wakes the client, whose WaitDone() returns it. Waiting spins
// briefly, then sleeps on the futex, and always ends by its deadline.
//
// Untrusted peer: the page is shared with another process, so every value read from it is
// checked by its reader (the shard checks layer, offset and rows against its shape and buffers; the
// client takes only the sequence number it expects); nothing read from the page is an address or
// a length that sizes memory.
//
// Names: "/tandem-mlp-" + 32 hex digits (128 random bits), created O_EXCL with mode 0600 and
// unlinked by its creator's destructor; Open() refuses any other name and a page of another
// size.
//
// Thread-safety: the client side from one thread, the shard side from one thread.

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::mlp {

class IpcDoorbell {
 public:
  // Creates a new page (the shard side).
  static absl::StatusOr<IpcDoorbell> Create();
  // Opens the page named `name` (the client side).
  static absl::StatusOr<IpcDoorbell> Open(const std::string& name);
  // Whether `name` has the form Create() gives.
  static bool ValidName(const std::string& name);

  IpcDoorbell(IpcDoorbell&& other) noexcept;
  IpcDoorbell& operator=(IpcDoorbell&& other) noexcept;
  ~IpcDoorbell();

  const std::string& name() const { return name_; }

  // Client: starts call `layer` over `rows` rows at row `row_offset` of the session's buffers;
  // returns its sequence number.
  uint32_t Ring(int layer, int row_offset, int rows);
  // Client: the sequence number the next Ring returns (for work queued before it that names it).
  uint32_t next_seq() const { return next_seq_ + 1; }
  // Client: the answer code of call `seq` (0: queued), DeadlineExceeded past `deadline`.
  absl::StatusOr<int32_t> WaitDone(uint32_t seq, absl::Time deadline);

  // Shard: the next call's sequence number, layer, row offset and rows; DeadlineExceeded when none
  // came by `deadline` (callers loop, checking their stop flag between waits).
  struct Request {
    uint32_t seq = 0;
    int32_t layer = 0;
    int32_t row_offset = 0;
    int32_t rows = 0;
  };
  absl::StatusOr<Request> WaitRequest(absl::Time deadline);
  // Shard: answers call `seq` with `code` (0: queued).
  void Finish(uint32_t seq, int32_t code);

 private:
  struct Page;
  IpcDoorbell(std::string name, Page* page, bool owner)
      : name_(std::move(name)), page_(page), owner_(owner) {}
  void Close();

  std::string name_;
  Page* page_ = nullptr;
  bool owner_ = false;
  uint32_t next_seq_ = 0;  // client: the last call rung; shard: the last call seen
};

}  // namespace tandem::mlp
