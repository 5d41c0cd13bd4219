#include "kvtransfer/cuda_ipc/peer_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::cuda_ipc {

absl::StatusOr<std::unique_ptr<PeerProcess>> PeerProcess::Start(const std::string& binary,
                                                                uint64_t bytes, int device,
                                                                absl::Duration timeout) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) return absl::InternalError("pipe failed");
  const std::string bytes_arg = std::to_string(bytes), device_arg = std::to_string(device);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    close(in[0]);
    close(in[1]);
    close(out[0]);
    close(out[1]);
    execl(binary.c_str(), binary.c_str(), "--bytes", bytes_arg.c_str(), "--device",
          device_arg.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  std::unique_ptr<PeerProcess> p(new PeerProcess());
  p->pid_ = pid;
  p->to_child_ = in[1];
  p->from_child_ = out[0];
  for (std::string* field : {&p->address_, &p->region_}) {
    auto line = p->ReadLine(timeout);
    if (!line.ok()) return line.status();
    const size_t space = line->find(' ');
    if (space == std::string::npos) {
      return absl::InternalError(absl::StrCat("peer: unexpected line '", *line, "'"));
    }
    *field = line->substr(space + 1);
  }
  return p;
}

PeerProcess::~PeerProcess() {
  if (pid_ <= 0) return;
  (void)!write(to_child_, "quit\n", 5);
  close(to_child_);
  for (int i = 0; i < 100; ++i) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      close(from_child_);
      return;
    }
    usleep(10000);
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  close(from_child_);
}

absl::StatusOr<std::string> PeerProcess::Command(const std::string& command,
                                                 absl::Duration timeout) {
  const std::string line = command + "\n";
  if (write(to_child_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    return absl::UnavailableError("peer: write failed (exited?)");
  }
  return ReadLine(timeout);
}

absl::StatusOr<std::string> PeerProcess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const size_t nl = buffered_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return absl::DeadlineExceededError("peer: no answer in time");
    pollfd fd{.fd = from_child_, .events = POLLIN, .revents = 0};
    if (poll(&fd, 1, static_cast<int>(left)) <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(from_child_, chunk, sizeof(chunk));
    if (n <= 0) return absl::UnavailableError("peer: exited before answering");
    buffered_.append(chunk, static_cast<size_t>(n));
  }
}

}  // namespace tandem::kvtransfer::cuda_ipc
