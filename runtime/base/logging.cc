#include "runtime/base/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "runtime/base/json_string.h"

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

std::atomic<int>& FormatStorage() {
  static std::atomic<int> format(static_cast<int>(LogFormat::kText));
  return format;
}

const char* SeverityName(LogSeverity s) {
  switch (s) {
    case LogSeverity::kDebug:
      return "DEBUG";
    case LogSeverity::kInfo:
      return "INFO";
    case LogSeverity::kWarning:
      return "WARNING";
    case LogSeverity::kError:
      return "ERROR";
    case LogSeverity::kFatal:
      return "FATAL";
  }
  return "?";
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

void SetLogFormat(LogFormat format) { FormatStorage().store(static_cast<int>(format)); }

bool ParseLogFormat(std::string_view name, LogFormat* format) {
  if (name == "text") {
    *format = LogFormat::kText;
    return true;
  }
  if (name == "json") {
    *format = LogFormat::kJson;
    return true;
  }
  return false;
}

LogMessage::LogMessage(const char* file, int line, LogSeverity severity)
    : severity_(severity), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  const char* base = std::strrchr(file_, '/');
  base = base ? base + 1 : file_;
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm;
  gmtime_r(&t, &tm);
  std::string s;
  if (static_cast<LogFormat>(FormatStorage().load()) == LogFormat::kJson) {
    char ts[40];
    std::strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    const int ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() %
        1000);
    char frac[8];
    std::snprintf(frac, sizeof(frac), ".%03dZ", ms);
    s.append("{\"ts\":\"").append(ts).append(frac);
    s.append("\",\"level\":\"").append(SeverityName(severity_)).append("\",\"source\":");
    AppendJsonString(std::string(base) + ":" + std::to_string(line_), &s);
    s.append(",\"msg\":");
    AppendJsonString(stream_.str(), &s);
    s.append("}\n");
  } else {
    char buf[32];
    std::strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
    s.push_back(SeverityLetter(severity_));
    s.append(" ").append(buf).append(" ").append(base).append(":");
    s.append(std::to_string(line_)).append("] ").append(stream_.str()).append("\n");
  }
  ssize_t unused = ::write(STDERR_FILENO, s.data(), s.size());
  (void)unused;
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace tandem
