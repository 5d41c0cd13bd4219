#pragma once
// The one thread that owns a worker's TransferBackend (kvtransfer's backends are not
// thread-safe). Everything that touches the backend runs here, in order: tasks posted from any
// thread (register and export memory, connect, post writes, release), and pollers that run on
// every tick until they report done (a posted transfer waiting for completion). Between ticks the
// thread progresses the backend, which the target side needs too (UCX tcp / shared memory).
//
// Threading: Post, AddPoller, Run and Stop may be called from any thread, but a task must not
// call Run (it would wait on itself). Tasks and pollers must return quickly: they never wait on
// the network.
// Stop (also the destructor): pending tasks are dropped, every poller is called once more with
// `stopping` = true so it can release what it holds, then the backend is destroyed on this thread.

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {

class TransferThread {
 public:
  using Task = std::function<void(TransferBackend&)>;
  // Returns true when done (then it is dropped). With `stopping`, it must clean up and return true.
  using Poller = std::function<bool(TransferBackend&, bool stopping)>;

  // `busy_tick`: how often pollers run while any is waiting (a transfer in flight: this bounds
  // how late its completion is seen); `idle_tick`: how often the backend progresses otherwise
  // (target-side progress for UCX tcp / shared memory).
  explicit TransferThread(std::unique_ptr<TransferBackend> backend,
                          absl::Duration busy_tick = absl::Microseconds(50),
                          absl::Duration idle_tick = absl::Milliseconds(2));
  ~TransferThread();
  TransferThread(const TransferThread&) = delete;
  TransferThread& operator=(const TransferThread&) = delete;

  const std::string& backend_name() const { return backend_name_; }

  // Runs `task` on the thread soon; false (and the task dropped) after Stop.
  bool Post(Task task);
  bool AddPoller(Poller poller);
  // Runs `fn` on the thread and returns its status; DeadlineExceeded when it has not finished
  // within `timeout` (it may still run later), Unavailable after Stop.
  absl::Status Run(std::function<absl::Status(TransferBackend&)> fn, absl::Duration timeout);

  void Stop();

 private:
  void Loop();

  const std::string backend_name_;
  const absl::Duration busy_tick_;
  const absl::Duration idle_tick_;
  std::unique_ptr<TransferBackend> backend_;  // used on thread_ only

  absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<Poller> new_pollers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex stop_mu_;  // serializes Stop callers
  std::thread thread_;
};

}  // namespace tandem::kvtransfer
