#pragma once
// Test helper: child processes for the `tandem bench` suites (a server to talk to, and the
// `tandem` binary under test). A child's stdout/stderr go to files; every wait has a deadline,
// after which the child is killed and the wait reports it (a hang fails the test, never blocks
// the suite). Not thread-safe; one Subprocess per child, owned by one test.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tandem::bench::testing {

inline std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class Subprocess {
 public:
  // Starts `argv` with stdout and stderr redirected to `<log_prefix>.out` / `.err`.
  Subprocess(const std::vector<std::string>& argv, const std::string& log_prefix)
      : out_path_(log_prefix + ".out"), err_path_(log_prefix + ".err") {
    // Opened (and emptied) before the fork: a reader never sees a previous run's output.
    const int out = open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int err = open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(out, 1);
      dup2(err, 2);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(out);
    close(err);
  }
  ~Subprocess() {
    if (running()) {
      kill(pid_, SIGKILL);
      Wait(5);
    }
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  bool running() const { return pid_ > 0 && !exited_; }
  void Signal(int sig) {
    if (running()) kill(pid_, sig);
  }
  // Waits up to `timeout_s`; returns the exit status (128+signal when killed by one), or -1 after
  // killing a child that did not exit in time.
  int Wait(double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    while (running()) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return code_;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        exited_ = true;
        code_ = -1;
        return code_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return code_;
  }
  // Polls stdout until it contains `needle`; false on timeout or exit.
  bool WaitForOutput(const std::string& needle, double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    while (std::chrono::steady_clock::now() < deadline) {
      if (stdout_text().find(needle) != std::string::npos) return true;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return stdout_text().find(needle) != std::string::npos;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  std::string stdout_text() const { return ReadAll(out_path_); }
  std::string stderr_text() const { return ReadAll(err_path_); }

 private:
  std::string out_path_, err_path_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int code_ = -1;
};

}  // namespace tandem::bench::testing
