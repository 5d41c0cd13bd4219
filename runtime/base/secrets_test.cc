#include "runtime/base/secrets.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ConstantTimeEqualsTest, ComparesContentAndLength) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret2"));
  EXPECT_FALSE(ConstantTimeEquals("secret", ""));
  EXPECT_FALSE(ConstantTimeEquals(absl::string_view("a\0b", 3), absl::string_view("a\0c", 3)));
}

TEST(RandomTest, BytesAndHexAreFresh) {
  auto a = RandomHex(16);
  auto b = RandomHex(16);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  auto raw = RandomBytes(4096);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->size(), 4096u);
  // 4096 random bytes all zero would be a broken source.
  EXPECT_NE(raw->find_first_not_of('\0'), std::string::npos);
}

}  // namespace
}  // namespace tandem
