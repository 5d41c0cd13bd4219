#include "runtime/auth/kv_grant.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <vector>

#include "gtest/gtest.h"

namespace tandem::auth {
namespace {

TEST(KvGrantTest, VerifiesOnlyTheExactFieldsThatWereGranted) {
  auto key = NewGrantKey();
  ASSERT_TRUE(key.ok());
  ASSERT_EQ(key->size(), kGrantKeyBytes);
  const std::vector<int32_t> blocks = {4, 9, 2};
  auto grant = KvGrant(*key, "pair", 7, "req-1", 16, blocks);
  ASSERT_TRUE(grant.ok());
  EXPECT_EQ(grant->size(), kGrantBytes);
  EXPECT_TRUE(VerifyKvGrant(*key, *grant, "pair", 7, "req-1", 16, blocks).ok());

  // Any field changed, or another key: refused.
  const std::vector<int32_t> other_blocks = {4, 9, 3};
  const std::vector<int32_t> fewer_blocks = {4, 9};
  auto other_key = NewGrantKey();
  ASSERT_TRUE(other_key.ok());
  for (absl::Status s : {VerifyKvGrant(*key, *grant, "pair", 7, "req-1", 16, other_blocks),
                         VerifyKvGrant(*key, *grant, "pair", 7, "req-1", 16, fewer_blocks),
                         VerifyKvGrant(*key, *grant, "pair", 8, "req-1", 16, blocks),
                         VerifyKvGrant(*key, *grant, "pair", 7, "req-2", 16, blocks),
                         VerifyKvGrant(*key, *grant, "pair", 7, "req-1", 0, blocks),
                         VerifyKvGrant(*key, *grant, "pai", 7, "req-1", 16, blocks),
                         VerifyKvGrant(*other_key, *grant, "pair", 7, "req-1", 16, blocks),
                         VerifyKvGrant(*key, "", "pair", 7, "req-1", 16, blocks)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  }
  // Field boundaries are length-prefixed: moving bytes between fields changes the grant.
  auto shifted = KvGrant(*key, "pairr", 7, "eq-1", 16, blocks);
  ASSERT_TRUE(shifted.ok());
  EXPECT_NE(*shifted, *grant);
}

TEST(KvGrantTest, MatchesAnIndependentHmacSha256OfTheCanonicalEncoding) {
  const std::string key(kGrantKeyBytes, '\x42');
  auto grant = KvGrant(key, "p", 1, "r", 2, std::vector<int32_t>{3});
  ASSERT_TRUE(grant.ok());
  // The encoding written out by hand: u64 little-endian lengths and values.
  std::string message;
  const auto u64 = [&message](uint64_t v) {
    for (int i = 0; i < 8; ++i) message.push_back(static_cast<char>(v >> (8 * i)));
  };
  const std::string domain = "tandem.kv-grant.v1";
  u64(domain.size());
  message += domain;
  u64(1);
  message += "p";
  u64(1);  // epoch
  u64(1);
  message += "r";
  u64(2);  // num_cached_tokens
  u64(1);  // one block
  u64(3);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len);
  EXPECT_EQ(*grant, std::string(reinterpret_cast<const char*>(mac), len));
}

TEST(KvGrantTest, RejectsAKeyOfTheWrongSize) {
  EXPECT_EQ(KvGrant("short", "p", 1, "r", 0, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::auth
