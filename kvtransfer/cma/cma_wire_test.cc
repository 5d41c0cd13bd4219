// The cma blobs: round trips, and every truncation, extension and garbage variant rejected.
#include "kvtransfer/cma/cma_wire.h"

#include <unistd.h>

#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem::kvtransfer::cma {
namespace {

AgentAddress SampleAddress() {
  AgentAddress a;
  a.boot_id = "58fbbabb-55ef-4616-96c5-1d7f5cd4d98c";
  a.pid = 4242;
  a.start_time = 123456789;
  a.nonce_address = 0x7ffd12345670ull;
  for (size_t i = 0; i < kNonceBytes; ++i) a.nonce[i] = static_cast<uint8_t>(0xf0 + i);
  return a;
}

TEST(CmaWireTest, AgentAddressRoundTrips) {
  const AgentAddress a = SampleAddress();
  const std::string blob = EncodeAgentAddress(a);
  EXPECT_EQ(blob, absl::StrCat("cma/1;boot=58fbbabb-55ef-4616-96c5-1d7f5cd4d98c;pid=4242;"
                               "start=123456789;nonce_at=",
                               a.nonce_address, ";nonce=f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff;end"));
  auto b = DecodeAgentAddress(blob);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->boot_id, a.boot_id);
  EXPECT_EQ(b->pid, a.pid);
  EXPECT_EQ(b->start_time, a.start_time);
  EXPECT_EQ(b->nonce_address, a.nonce_address);
  EXPECT_EQ(b->nonce, a.nonce);
}

TEST(CmaWireTest, RegionRoundTrips) {
  const RegionBlob r{.id = 7, .base = 0x7f0000001000ull, .length = 1ull << 30};
  auto d = DecodeRegionBlob(EncodeRegionBlob(r));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->id, r.id);
  EXPECT_EQ(d->base, r.base);
  EXPECT_EQ(d->length, r.length);
}

TEST(CmaWireTest, EveryTruncationAndExtensionIsRejected) {
  const std::string address = EncodeAgentAddress(SampleAddress());
  const std::string region = EncodeRegionBlob({.id = 3, .base = 4096, .length = 65536});
  for (size_t n = 0; n < address.size(); ++n) {
    EXPECT_FALSE(DecodeAgentAddress(address.substr(0, n)).ok()) << address.substr(0, n);
  }
  for (size_t n = 0; n < region.size(); ++n) {
    EXPECT_FALSE(DecodeRegionBlob(region.substr(0, n)).ok()) << region.substr(0, n);
  }
  for (const std::string& tail :
       std::vector<std::string>{";", ";x=1", "0", "d", " ", "\n", std::string(1, '\0')}) {
    EXPECT_FALSE(DecodeAgentAddress(address + tail).ok()) << tail;
    EXPECT_FALSE(DecodeRegionBlob(region + tail).ok()) << tail;
  }
  // One kind of blob is never taken for the other.
  EXPECT_FALSE(DecodeAgentAddress(region).ok());
  EXPECT_FALSE(DecodeRegionBlob(address).ok());
}

TEST(CmaWireTest, MalformedFieldsAreRejected) {
  const std::string boot = "58fbbabb-55ef-4616-96c5-1d7f5cd4d98c";
  const std::string nonce = "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff";
  auto address = [&](const std::string& b, const std::string& pid, const std::string& start,
                     const std::string& at, const std::string& n) {
    return "cma/1;boot=" + b + ";pid=" + pid + ";start=" + start + ";nonce_at=" + at +
           ";nonce=" + n + ";end";
  };
  ASSERT_TRUE(DecodeAgentAddress(address(boot, "1", "0", "8", nonce)).ok());
  ASSERT_TRUE(DecodeRegionBlob("cma/1;region=0;base=1;length=1;end").ok());
  const std::vector<std::string> bad = {
      address("58FBBABB-55ef-4616-96c5-1d7f5cd4d98c", "1", "0", "8", nonce),  // upper case
      address("58fbbabb055ef-4616-96c5-1d7f5cd4d98c", "1", "0", "8", nonce),  // no dash
      address("58fbbabb-55ef-4616-96c5-1d7f5cd4d98", "1", "0", "8", nonce),   // short
      address("", "1", "0", "8", nonce),
      address(boot, "0", "0", "8", nonce),                     // pid 0
      address(boot, "4194305", "0", "8", nonce),               // past PID_MAX_LIMIT
      address(boot, "-1", "0", "8", nonce),                    // sign
      address(boot, "+1", "0", "8", nonce),                    // sign
      address(boot, "01", "0", "8", nonce),                    // leading zero
      address(boot, " 1", "0", "8", nonce),                    // space
      address(boot, "1", "", "8", nonce),                      // empty
      address(boot, "1", "18446744073709551616", "8", nonce),  // 2^64
      address(boot, "1", "0", "0", nonce),                     // null nonce address
      address(boot, "1", "0", "18446744073709551615", nonce),  // nonce wraps
      address(boot, "1", "0", "0x10", nonce),                  // hex
      address(boot, "1", "0", "8", nonce.substr(2)),           // short nonce
      address(boot, "1", "0", "8", nonce + "00"),              // long nonce
      address(boot, "1", "0", "8", "F0F1F2F3F4F5F6F7F8F9FAFBFCFDFEFF"),
      address(boot, "1", "0", "8", "g0f1f2f3f4f5f6f7f8f9fafbfcfdfeff"),
      "cma/2;boot=" + boot + ";pid=1;start=0;nonce_at=8;nonce=" + nonce + ";end",  // version
      "cma/1;pid=1;boot=" + boot + ";start=0;nonce_at=8;nonce=" + nonce + ";end",  // order
      "cma/1;boot=" + boot + ";pid=1;pid=1;start=0;nonce_at=8;nonce=" + nonce + ";end",
      "cma/1;boot=" + boot + ";pid=1;start=0;nonce_at=8",
      "cma/1;boot" + boot + ";pid=1;start=0;nonce_at=8;nonce=" + nonce + ";end",
      "cma/1;boot=" + boot + ";pid=1;start=0;nonce_at=8;nonce=" + nonce + ";end" +
          std::string(600, 'a'),
  };
  for (const std::string& blob : bad) {
    auto d = DecodeAgentAddress(blob);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << blob;
  }
  const std::vector<std::string> bad_regions = {
      "cma/1;region=1;base=0;length=1;end",                     // null base
      "cma/1;region=1;base=1;length=0;end",                     // empty
      "cma/1;region=1;base=18446744073709551615;length=2;end",  // wraps
      "cma/1;region=1;base=4096;length=-1;end",
      "cma/1;region=x;base=4096;length=1;end",
      "cma/1;base=4096;region=1;length=1;end",
      "cma/1;region=1;base=4096;end",
      "cma/1;region=1;base=4096;length=1;length=1;end",
      "cma/1;region=1;base=4096;length=1;End",
      "cma/1;region=1;base=4096;length=1",
      "ucx/1;region=1;base=4096;length=1;end",
  };
  for (const std::string& blob : bad_regions) {
    EXPECT_EQ(DecodeRegionBlob(blob).status().code(), absl::StatusCode::kInvalidArgument) << blob;
  }
}

TEST(CmaWireTest, RandomGarbageIsRejected) {
  std::mt19937 rng(5);
  const std::string address = EncodeAgentAddress(SampleAddress());
  for (int i = 0; i < 2000; ++i) {
    std::string blob(rng() % 120, '\0');
    for (char& c : blob) c = static_cast<char>(rng());
    EXPECT_FALSE(DecodeAgentAddress(blob).ok());
    EXPECT_FALSE(DecodeRegionBlob(blob).ok());
    // One flipped byte of a good address: either rejected or still a well-formed address.
    std::string flipped = address;
    flipped[rng() % flipped.size()] ^= static_cast<char>(1 + rng() % 255);
    auto d = DecodeAgentAddress(flipped);
    if (d.ok()) {
      EXPECT_EQ(EncodeAgentAddress(*d), flipped);
    }
  }
}

TEST(CmaWireTest, StartTimeComesFromField22) {
  // The command name may hold spaces and parentheses: fields count from the last ')'.
  const std::string stat =
      "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 10000 100 "
      "18446744073709551615\n";
  auto start = ParseStatStartTime(stat);
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_EQ(*start, 987654u);
  EXPECT_FALSE(ParseStatStartTime("4242 (a) S 1 2 3").ok());
  EXPECT_FALSE(ParseStatStartTime("no parens").ok());
  auto mine = ReadProcessStartTime(getpid());
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_GT(*mine, 0u);
  EXPECT_EQ(ReadProcessStartTime(1 << 23).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadBootId().size(), 36u);
}

}  // namespace
}  // namespace tandem::kvtransfer::cma
