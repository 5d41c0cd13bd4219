#pragma once
// Worker discovery for one pool (prefill or decode): a static list of "host:port" addresses
// (`--decode-workers a:1,b:2`) plus DNS names re-resolved every refresh period
// (`--decode-dns name:port`). A Kubernetes headless Service answers one A record per ready pod,
// so its name expands to one worker per pod; pods that leave the answer leave the pool (the
// WorkerPool drains them).
//
// Resolution never blocks the caller past a deadline: the system resolver runs getaddrinfo on a
// background thread and gives up waiting after `resolve_timeout` (the lookup itself finishes in
// the background; at most a few are outstanding at once). A failed lookup (timeout, temporary
// failure) keeps the name's previous addresses, so a DNS hiccup never empties a pool; only an
// authoritative "no such name" (NotFound) removes them.
//
// Threading: Create and Stop from one owner thread. The update callback runs on the refresh
// thread (or on the caller of Start / RefreshNow), never concurrently with itself. Stop (and the
// destructor) join the refresh thread; no callback runs after Stop returns.

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace tandem::router {

struct HostPort {
  std::string host;  // name or IP literal, without brackets
  int port = 0;
};

// "host:port" or "[v6-literal]:port"; InvalidArgument naming the text otherwise.
absl::StatusOr<HostPort> ParseHostPort(std::string_view text);
// "host:port" with brackets around IPv6 literals.
std::string JoinHostPort(std::string_view host, int port);
// Comma-separated "host:port" list (spaces and empty items ignored), normalized, duplicates
// removed, in the given order.
absl::StatusOr<std::vector<std::string>> ParseWorkerList(std::string_view text);

// Resolves `host` to IP literals. NotFound: the name has no addresses; DeadlineExceeded: no
// answer within `timeout`; Unavailable: a temporary failure.
using Resolver = std::function<absl::StatusOr<std::vector<std::string>>(const std::string& host,
                                                                        absl::Duration timeout)>;
// getaddrinfo (A and AAAA records) on a background thread, waited for at most `timeout`.
Resolver SystemResolver();

class Discovery {
 public:
  struct Options {
    std::vector<std::string> static_workers;  // "host:port", used as they are
    std::vector<std::string> dns_names;       // "name:port", re-resolved every `refresh`
    absl::Duration refresh = absl::Seconds(10);
    absl::Duration resolve_timeout = absl::Seconds(2);
    Resolver resolver;  // default: SystemResolver()
  };
  // The whole membership (sorted, unique "host:port"), each time it changes; the first round
  // always delivers, even when empty.
  using UpdateCallback = std::function<void(const std::vector<std::string>& addresses)>;

  // InvalidArgument for a malformed address or DNS name.
  static absl::StatusOr<std::unique_ptr<Discovery>> Create(Options options,
                                                           UpdateCallback on_update);
  ~Discovery();

  // Runs one resolution round on the caller's thread (so the pool is filled before serving),
  // then, when there are DNS names, re-resolves on a background thread every `refresh`.
  void Start();
  void Stop();
  // One resolution round now (delivering a change, if any); returns the membership.
  std::vector<std::string> RefreshNow();

 private:
  Discovery(Options options, std::vector<HostPort> dns, UpdateCallback on_update);
  void Loop();

  const Options options_;
  const std::vector<HostPort> dns_;
  const UpdateCallback on_update_;
  absl::Notification stop_;
  std::thread thread_;

  absl::Mutex mu_;  // serializes rounds
  // The last good answer for each DNS name (kept when a lookup fails).
  absl::flat_hash_map<std::string, std::vector<std::string>> last_answer_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> members_ ABSL_GUARDED_BY(mu_);
  bool delivered_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::router
