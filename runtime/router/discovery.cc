#include "runtime/router/discovery.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/base/logging.h"

namespace tandem::router {
namespace {

// getaddrinfo cannot be cancelled; lookups that outlive their deadline finish in the background.
// This bounds how many may pile up behind a hung resolver.
constexpr int kMaxOutstandingLookups = 8;
std::atomic<int> outstanding_lookups{0};

struct Lookup {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<std::vector<std::string>> result ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::vector<std::string>> GetAddrInfo(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* info = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &info);
  if (rc == EAI_NONAME
#ifdef EAI_NODATA
      || rc == EAI_NODATA
#endif
  ) {
    return absl::NotFoundError(absl::StrCat("DNS: no addresses for ", host));
  }
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("DNS lookup of ", host, ": ", gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (addrinfo* p = info; p != nullptr; p = p->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    const void* addr = nullptr;
    if (p->ai_family == AF_INET) {
      addr = &reinterpret_cast<sockaddr_in*>(p->ai_addr)->sin_addr;
    } else if (p->ai_family == AF_INET6) {
      addr = &reinterpret_cast<sockaddr_in6*>(p->ai_addr)->sin6_addr;
    } else {
      continue;
    }
    if (inet_ntop(p->ai_family, addr, buf, sizeof(buf)) == nullptr) continue;
    if (std::find(out.begin(), out.end(), buf) == out.end()) out.push_back(buf);
  }
  freeaddrinfo(info);
  if (out.empty()) return absl::NotFoundError(absl::StrCat("DNS: no addresses for ", host));
  return out;
}

// Debian's Abseil has its own string_view type.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

absl::StatusOr<HostPort> ParseHostPort(std::string_view text) {
  const auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad worker address '", Av(text), "' (", Av(why), "; want host:port)"));
  };
  HostPort out;
  std::string_view port;
  if (absl::StartsWith(Av(text), "[")) {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return bad("unterminated IPv6 literal");
    }
    out.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    out.host = std::string(text.substr(0, colon));
    if (out.host.find(':') != std::string::npos) return bad("IPv6 literals need [brackets]");
    port = text.substr(colon + 1);
  }
  if (out.host.empty()) return bad("empty host");
  if (!absl::SimpleAtoi(Av(port), &out.port) || out.port <= 0 || out.port > 65535) {
    return bad("port must be 1..65535");
  }
  return out;
}

std::string JoinHostPort(std::string_view host, int port) {
  if (host.find(':') != std::string_view::npos) return absl::StrCat("[", Av(host), "]:", port);
  return absl::StrCat(Av(host), ":", port);
}

absl::StatusOr<std::vector<std::string>> ParseWorkerList(std::string_view text) {
  std::vector<std::string> out;
  for (absl::string_view item : absl::StrSplit(Av(text), ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) continue;
    auto parsed = ParseHostPort(std::string_view(item.data(), item.size()));
    if (!parsed.ok()) return parsed.status();
    std::string address = JoinHostPort(parsed->host, parsed->port);
    if (std::find(out.begin(), out.end(), address) == out.end()) out.push_back(std::move(address));
  }
  return out;
}

Resolver SystemResolver() {
  return [](const std::string& host,
            absl::Duration timeout) -> absl::StatusOr<std::vector<std::string>> {
    if (outstanding_lookups.fetch_add(1) >= kMaxOutstandingLookups) {
      outstanding_lookups.fetch_sub(1);
      return absl::UnavailableError(
          absl::StrCat("DNS lookup of ", host, " skipped: earlier lookups still hang"));
    }
    auto lookup = std::make_shared<Lookup>();
    std::thread([lookup, host] {
      auto result = GetAddrInfo(host);
      absl::MutexLock lock(&lookup->mu);
      lookup->result = std::move(result);
      lookup->done = true;
      outstanding_lookups.fetch_sub(1);
    }).detach();
    absl::MutexLock lock(&lookup->mu);
    if (!lookup->mu.AwaitWithTimeout(absl::Condition(&lookup->done), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("DNS lookup of ", host, " took longer than ",
                                                      absl::FormatDuration(timeout)));
    }
    return lookup->result;
  };
}

absl::StatusOr<std::unique_ptr<Discovery>> Discovery::Create(Options options,
                                                             UpdateCallback on_update) {
  std::vector<std::string> normalized;
  for (const std::string& address : options.static_workers) {
    auto parsed = ParseHostPort(address);
    if (!parsed.ok()) return parsed.status();
    normalized.push_back(JoinHostPort(parsed->host, parsed->port));
  }
  options.static_workers = std::move(normalized);
  std::vector<HostPort> dns;
  for (const std::string& name : options.dns_names) {
    auto parsed = ParseHostPort(name);
    if (!parsed.ok()) return parsed.status();
    dns.push_back(*std::move(parsed));
  }
  if (!options.resolver) options.resolver = SystemResolver();
  if (options.refresh <= absl::ZeroDuration()) options.refresh = absl::Seconds(10);
  return std::unique_ptr<Discovery>(
      new Discovery(std::move(options), std::move(dns), std::move(on_update)));
}

Discovery::Discovery(Options options, std::vector<HostPort> dns, UpdateCallback on_update)
    : options_(std::move(options)), dns_(std::move(dns)), on_update_(std::move(on_update)) {}

Discovery::~Discovery() { Stop(); }

void Discovery::Start() {
  RefreshNow();
  if (!dns_.empty() && !thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

void Discovery::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void Discovery::Loop() {
  while (!stop_.WaitForNotificationWithTimeout(options_.refresh)) RefreshNow();
}

std::vector<std::string> Discovery::RefreshNow() {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> members;
  const auto add = [&](std::string address) {
    if (seen.insert(address).second) members.push_back(std::move(address));
  };
  for (const std::string& address : options_.static_workers) add(address);
  for (const HostPort& name : dns_) {
    const std::string key = JoinHostPort(name.host, name.port);
    auto answer = options_.resolver(name.host, options_.resolve_timeout);
    if (answer.ok()) {
      last_answer_[key] = *answer;
    } else if (absl::IsNotFound(answer.status())) {
      last_answer_[key].clear();
    } else {
      LOG(WARNING) << "discovery: " << answer.status().message()
                   << " (keeping the previous addresses of " << key << ")";
    }
    for (const std::string& ip : last_answer_[key]) add(JoinHostPort(ip, name.port));
  }
  std::sort(members.begin(), members.end());
  if (!delivered_ || members != members_) {
    delivered_ = true;
    members_ = members;
    if (on_update_) on_update_(members_);
  }
  return members;
}

}  // namespace tandem::router
