#pragma once
// Minimal leveled logging to stderr and CHECK for broken invariants (never for bad input: that
// is an absl::Status). Thread-safe: each message is written with one write call.
//
//   LOG(INFO) << "loaded " << n << " tensors";
//   CHECK(ptr != nullptr) << "why";       // aborts with file:line and the message
//   CHECK_EQ(a, b);

#include <sstream>
#include <string_view>

namespace tandem {

enum class LogSeverity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Messages below this level are dropped. Default kInfo; TANDEM_LOG_LEVEL=debug|info|warning|error
// in the environment overrides it at first use.
LogSeverity MinLogSeverity();
void SetMinLogSeverity(LogSeverity severity);

// kText: "I 12:34:56 file.cc:42] message". kJson: one JSON object per line,
// {"ts":"2026-12-02T12:34:56.789Z","level":"INFO","source":"file.cc:42","msg":"message"}, for log
// pipelines (`--log-format json`). Process-wide; set once at start-up.
enum class LogFormat { kText, kJson };
void SetLogFormat(LogFormat format);
// "text" or "json"; InvalidArgument-free: false for anything else.
bool ParseLogFormat(std::string_view name, LogFormat* format);

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogSeverity severity);
  ~LogMessage();  // writes the line; aborts for kFatal
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

// Swallows a stream expression when the log level is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace tandem

#define TANDEM_LOG_DEBUG ::tandem::LogSeverity::kDebug
#define TANDEM_LOG_INFO ::tandem::LogSeverity::kInfo
#define TANDEM_LOG_WARNING ::tandem::LogSeverity::kWarning
#define TANDEM_LOG_ERROR ::tandem::LogSeverity::kError
#define TANDEM_LOG_FATAL ::tandem::LogSeverity::kFatal

#define LOG(level)                                  \
  (TANDEM_LOG_##level < ::tandem::MinLogSeverity()) \
      ? (void)0                                     \
      : ::tandem::LogVoidify() &                    \
            ::tandem::LogMessage(__FILE__, __LINE__, TANDEM_LOG_##level).stream()

#define CHECK(cond)                                                                             \
  (cond) ? (void)0                                                                              \
         : ::tandem::LogVoidify() &                                                             \
               ::tandem::LogMessage(__FILE__, __LINE__, ::tandem::LogSeverity::kFatal).stream() \
                   << "Check failed: " #cond " "

#define CHECK_OP_(a, b, op) CHECK((a)op(b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_EQ(a, b) CHECK_OP_(a, b, ==)
#define CHECK_NE(a, b) CHECK_OP_(a, b, !=)
#define CHECK_LT(a, b) CHECK_OP_(a, b, <)
#define CHECK_LE(a, b) CHECK_OP_(a, b, <=)
#define CHECK_GT(a, b) CHECK_OP_(a, b, >)
#define CHECK_GE(a, b) CHECK_OP_(a, b, >=)
