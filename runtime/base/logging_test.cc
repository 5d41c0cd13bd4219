#include "runtime/base/logging.h"

#include <string>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(LoggingTest, TextAndJsonFormats) {
  testing::internal::CaptureStderr();
  LOG(INFO) << "plain " << 42;
  SetLogFormat(LogFormat::kJson);
  LOG(WARNING) << "say \"hi\"\\\n\t" << std::string(1, '\x01');
  SetLogFormat(LogFormat::kText);
  const std::string out = testing::internal::GetCapturedStderr();
  const size_t newline = out.find('\n');
  ASSERT_NE(newline, std::string::npos) << out;
  const std::string text = out.substr(0, newline);
  EXPECT_EQ(text.rfind("I ", 0), 0u) << text;
  EXPECT_NE(text.find("logging_test.cc:"), std::string::npos) << text;
  EXPECT_NE(text.find("] plain 42"), std::string::npos) << text;
  const std::string json = out.substr(newline + 1);
  EXPECT_EQ(json.rfind("{\"ts\":\"", 0), 0u) << json;
  EXPECT_NE(json.find("\"level\":\"WARNING\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"source\":\"logging_test.cc:"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("msg":"say \"hi\"\\\n\t\u0001"})"), std::string::npos) << json;
  EXPECT_EQ(json.back(), '\n');
  EXPECT_EQ(json.find('\n'), json.size() - 1) << "one line per message";
}

TEST(LoggingTest, ParseLogFormat) {
  LogFormat f = LogFormat::kText;
  EXPECT_TRUE(ParseLogFormat("json", &f));
  EXPECT_EQ(f, LogFormat::kJson);
  EXPECT_TRUE(ParseLogFormat("text", &f));
  EXPECT_EQ(f, LogFormat::kText);
  EXPECT_FALSE(ParseLogFormat("xml", &f));
}

}  // namespace
}  // namespace tandem
