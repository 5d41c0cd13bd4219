#include "runtime/base/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace tandem {
namespace {

LogSeverity SeverityFromEnv() {
  const char* env = std::getenv("TANDEM_LOG_LEVEL");
  if (env == nullptr) return LogSeverity::kInfo;
  std::string_view v(env);
  if (v == "debug") return LogSeverity::kDebug;
  if (v == "warning") return LogSeverity::kWarning;
  if (v == "error") return LogSeverity::kError;
  return LogSeverity::kInfo;
}

std::atomic<int>& MinSeverityStorage() {
  static std::atomic<int> level(static_cast<int>(SeverityFromEnv()));
  return level;
}

char SeverityLetter(LogSeverity s) {
  switch (s) {
    case LogSeverity::kDebug:
      return 'D';
    case LogSeverity::kInfo:
      return 'I';
    case LogSeverity::kWarning:
      return 'W';
    case LogSeverity::kError:
      return 'E';
    case LogSeverity::kFatal:
      return 'F';
  }
  return '?';
}

}  // namespace

LogSeverity MinLogSeverity() { return static_cast<LogSeverity>(MinSeverityStorage().load()); }
void SetMinLogSeverity(LogSeverity severity) {
  MinSeverityStorage().store(static_cast<int>(severity));
}

LogMessage::LogMessage(const char* file, int line, LogSeverity severity) : severity_(severity) {
  const char* base = std::strrchr(file, '/');
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
  stream_ << SeverityLetter(severity) << ' ' << buf << ' ' << (base ? base + 1 : file) << ':'
          << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  std::string s = stream_.str();
  ssize_t unused = ::write(STDERR_FILENO, s.data(), s.size());
  (void)unused;
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace tandem
