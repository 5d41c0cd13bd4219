#include "runtime/model/safetensors.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/float16.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// --- float16.h against IEEE bit patterns ---------------------------------------------------

TEST(Float16Test, Bf16FromFloatRoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3F808000)), 0x3F80);  // tie, even below: down
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3F818000)), 0x3F82);  // tie, odd below: up
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3F808001)), 0x3F81);  // above the tie: up
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3F807FFF)), 0x3F80);  // below the tie: down
  EXPECT_EQ(FloatToBf16(3.140625f), 0x4049);                // exactly representable
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x7F7FFFFF)), 0x7F80);  // FLT_MAX rounds to inf
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x00000001)), 0x0000);  // tiniest denormal
}

TEST(Float16Test, Bf16SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBf16(inf), 0x7F80);
  EXPECT_EQ(FloatToBf16(-inf), 0xFF80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::quiet_NaN()) & 0x7FC0, 0x7FC0);
  // A NaN with only low payload bits must stay NaN, not truncate to inf.
  const uint16_t nan = FloatToBf16(BitsToFloat(0x7F800001));
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x007F, 0);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(0x7FC0)));
  EXPECT_EQ(Bf16ToFloat(0xFF80), -inf);
  EXPECT_EQ(Bf16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0xC049), -3.140625f);
  EXPECT_EQ(Bf16ToFloat(0x0001), BitsToFloat(0x00010000));  // bf16 denormal
}

TEST(Float16Test, F16FromFloat) {
  EXPECT_EQ(FloatToF16(1.0f), 0x3C00);
  EXPECT_EQ(FloatToF16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToF16(0.1f), 0x2E66);
  EXPECT_EQ(FloatToF16(65504.0f), 0x7BFF);  // largest finite
  EXPECT_EQ(FloatToF16(65519.0f), 0x7BFF);  // below the tie to 65536
  EXPECT_EQ(FloatToF16(65520.0f), 0x7C00);  // tie rounds to even: infinity
  EXPECT_EQ(FloatToF16(1e10f), 0x7C00);
  EXPECT_EQ(FloatToF16(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(FloatToF16(std::ldexp(3.0f, -25)), 0x0002);  // tie to even: up
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(FloatToF16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie, even below
  EXPECT_EQ(FloatToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie, odd below
  EXPECT_EQ(FloatToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  const uint16_t nan = FloatToF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
}

TEST(Float16Test, F16ToFloat) {
  EXPECT_EQ(F16ToFloat(0x3C00), 1.0f);
  EXPECT_EQ(F16ToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(F16ToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToFloat(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(F16ToFloat(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(F16ToFloat(0x8000)));
  EXPECT_EQ(F16ToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToFloat(0x7E00)));
  // Every finite f16 survives a round trip through float32.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00) continue;
    ASSERT_EQ(FloatToF16(F16ToFloat(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

// --- safetensors files -----------------------------------------------------------------------

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) /
           ("safetensors_test_" +
            std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a file by hand, following the format spec: u64 LE header size, header, data.
  void WriteRaw(const std::string& file, const std::string& header, const std::string& data,
                uint64_t header_len_override = 0) {
    std::ofstream out(dir_ / file, std::ios::binary);
    uint64_t len = header_len_override != 0 ? header_len_override : header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xFF));
    out << header << data;
  }

  std::string ReadAll(const std::string& file) {
    std::ifstream in(dir_ / file, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }

  absl::Status OpenError() {
    absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(dir_.string());
    EXPECT_FALSE(store.ok());
    return store.ok() ? absl::OkStatus() : store.status();
  }

  fs::path dir_;
};

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

TEST_F(SafetensorsTest, ReadsHandWrittenFile) {
  // Two f32 tensors and metadata, written without WriteSafetensors.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}})";
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 4.0f};
  WriteRaw("model.safetensors", header,
           std::string(reinterpret_cast<const char*>(values.data()), 16));
  absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_THAT((*store)->Names(), ElementsAre("a", "b"));
  absl::StatusOr<TensorView> b = (*store)->GetWithShape("b", {2});
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<float> out;
  TensorStore::ToFloat32(*b, &out);
  EXPECT_THAT(out, ElementsAre(3.25f, 4.0f));
  absl::StatusOr<TensorView> a = (*store)->Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(a->shape, ElementsAre(1, 2));
  EXPECT_EQ(a->numel(), 2);
  EXPECT_EQ(a->nbytes, 8u);
  EXPECT_THAT(a->file, HasSubstr("model.safetensors"));
}

TEST_F(SafetensorsTest, RoundTripsAllDtypes) {
  std::map<std::string, TensorToWrite> tensors;
  tensors["f32"] = {DType::kF32, {2, 3}, Bytes(std::vector<float>{1, 2, 3, 4, 5, -6.5f})};
  // bf16 of 1.0, -2.0, 0.5; f16 of 1.0, 0.333251953125, -65504.
  tensors["bf16"] = {DType::kBF16, {3}, Bytes(std::vector<uint16_t>{0x3F80, 0xC000, 0x3F00})};
  tensors["f16"] = {DType::kF16, {3, 1}, Bytes(std::vector<uint16_t>{0x3C00, 0x3555, 0xFBFF})};
  tensors["empty"] = {DType::kF32, {0, 4}, {}};
  ASSERT_TRUE(WriteSafetensors((dir_ / "model.safetensors").string(), tensors).ok());

  const std::string raw = ReadAll("model.safetensors");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(raw[i]);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + header_len + 24 + 6 + 6);
  EXPECT_EQ(raw[8], '{');

  absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<float> out;
  TensorStore::ToFloat32(*(*store)->Get("f32"), &out);
  EXPECT_THAT(out, ElementsAre(1, 2, 3, 4, 5, -6.5f));
  absl::StatusOr<TensorView> bf16 = (*store)->Get("bf16");
  EXPECT_EQ(bf16->dtype, DType::kBF16);
  TensorStore::ToFloat32(*bf16, &out);
  EXPECT_THAT(out, ElementsAre(1.0f, -2.0f, 0.5f));
  absl::StatusOr<TensorView> f16 = (*store)->Get("f16");
  EXPECT_EQ(f16->dtype, DType::kF16);
  EXPECT_THAT(f16->shape, ElementsAre(3, 1));
  TensorStore::ToFloat32(*f16, &out);
  EXPECT_THAT(out, ElementsAre(1.0f, 0.333251953125f, -65504.0f));
  EXPECT_EQ((*store)->Get("empty")->numel(), 0);
  EXPECT_FALSE((*store)->Has("missing"));
  absl::StatusOr<TensorView> missing = (*store)->Get("missing");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing"));
}

TEST_F(SafetensorsTest, ToFloat32ConvertsLargeTensorsOnThreads) {
  const size_t n = (size_t{1} << 23) + 3;  // large enough to be split across threads
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < n; ++i) bits[i] = static_cast<uint16_t>(i * 2654435761u);
  std::map<std::string, TensorToWrite> tensors;
  tensors["big"] = {DType::kBF16, {static_cast<int64_t>(n)}, Bytes(bits)};
  ASSERT_TRUE(WriteSafetensors((dir_ / "model.safetensors").string(), tensors).ok());
  absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<float> out;
  TensorStore::ToFloat32(*(*store)->Get("big"), &out);
  ASSERT_EQ(out.size(), n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &out[i], 4);
    ASSERT_EQ(u, static_cast<uint32_t>(bits[i]) << 16) << i;
  }
}

// Found by fuzz/safetensors_fuzz.cc: an F32 tensor of no elements was converted with memcpy into
// the (null) data() of an empty vector, which is undefined even for 0 bytes.
TEST_F(SafetensorsTest, ToFloat32OfAnEmptyTensorIsEmpty) {
  WriteRaw("model.safetensors", R"({"w":{"dtype":"F32","shape":[0,7],"data_offsets":[0,0]}})", "");
  absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<float> fresh;  // data() is null (UBSan, in the sanitizer build, saw the memcpy)
  TensorStore::ToFloat32(*(*store)->Get("w"), &fresh);
  EXPECT_TRUE(fresh.empty());
  std::vector<float> used = {1.0f, 2.0f};
  TensorStore::ToFloat32(*(*store)->Get("w"), &used);
  EXPECT_TRUE(used.empty());
}

TEST_F(SafetensorsTest, WriteRejectsSizeMismatch) {
  std::map<std::string, TensorToWrite> tensors;
  tensors["x"] = {DType::kF32, {3}, std::vector<uint8_t>(8)};
  absl::Status s = WriteSafetensors((dir_ / "model.safetensors").string(), tensors);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("x"));
}

void WriteIndex(const fs::path& dir, const std::string& weight_map) {
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"metadata": {"total_size": 0}, "weight_map": )" << weight_map << "}";
}

TEST_F(SafetensorsTest, ReadsShardedIndex) {
  std::map<std::string, TensorToWrite> a, b;
  a["x"] = {DType::kF32, {1}, Bytes(std::vector<float>{7})};
  b["y"] = {DType::kBF16, {2}, Bytes(std::vector<uint16_t>{0x4000, 0x4040})};
  b["extra"] = {DType::kF32, {1}, Bytes(std::vector<float>{9})};
  ASSERT_TRUE(WriteSafetensors((dir_ / "model-00001-of-00002.safetensors").string(), a).ok());
  ASSERT_TRUE(WriteSafetensors((dir_ / "model-00002-of-00002.safetensors").string(), b).ok());
  WriteIndex(dir_, R"({"x": "model-00001-of-00002.safetensors",
                       "y": "model-00002-of-00002.safetensors"})");
  absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<float> out;
  TensorStore::ToFloat32(*(*store)->Get("y"), &out);
  EXPECT_THAT(out, ElementsAre(2.0f, 3.0f));
  EXPECT_THAT((*store)->Get("x")->file, HasSubstr("model-00001-of-00002.safetensors"));
  EXPECT_THAT((*store)->Get("y")->file, HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_TRUE((*store)->Has("extra"));
}

TEST_F(SafetensorsTest, IndexNamingMissingShardFails) {
  std::map<std::string, TensorToWrite> a;
  a["x"] = {DType::kF32, {1}, Bytes(std::vector<float>{7})};
  ASSERT_TRUE(WriteSafetensors((dir_ / "model-00001-of-00002.safetensors").string(), a).ok());
  WriteIndex(dir_, R"({"x": "model-00001-of-00002.safetensors",
                       "y": "model-00002-of-00002.safetensors"})");
  absl::Status s = OpenError();
  EXPECT_THAT(s.message(), HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors.index.json"));
}

TEST_F(SafetensorsTest, IndexNamingTensorAbsentFromShardFails) {
  std::map<std::string, TensorToWrite> a;
  a["x"] = {DType::kF32, {1}, Bytes(std::vector<float>{7})};
  ASSERT_TRUE(WriteSafetensors((dir_ / "shard.safetensors").string(), a).ok());
  WriteIndex(dir_, R"({"x": "shard.safetensors", "ghost": "shard.safetensors"})");
  absl::Status s = OpenError();
  EXPECT_THAT(s.message(), HasSubstr("ghost"));
  EXPECT_THAT(s.message(), HasSubstr("shard.safetensors"));
}

TEST_F(SafetensorsTest, BadIndexJsonFails) {
  std::ofstream(dir_ / "model.safetensors.index.json") << "{\"weight_map\": ";
  EXPECT_THAT(OpenError().message(), HasSubstr("model.safetensors.index.json"));
}

TEST_F(SafetensorsTest, MissingDirectoryOrWeightsFails) {
  EXPECT_THAT(OpenError().message(), HasSubstr(dir_.string()));
  absl::StatusOr<std::unique_ptr<TensorStore>> s =
      TensorStore::Open((dir_ / "does_not_exist").string());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("does_not_exist"));
}

TEST_F(SafetensorsTest, TruncatedFileFails) {
  std::map<std::string, TensorToWrite> t;
  t["weight"] = {DType::kF32, {64}, std::vector<uint8_t>(256, 1)};
  const fs::path path = dir_ / "model.safetensors";
  ASSERT_TRUE(WriteSafetensors(path.string(), t).ok());
  fs::resize_file(path, fs::file_size(path) - 10);
  absl::Status s = OpenError();
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr("weight"));

  fs::resize_file(path, 5);
  EXPECT_THAT(OpenError().message(), HasSubstr("model.safetensors"));
  fs::resize_file(path, 0);
  EXPECT_THAT(OpenError().message(), HasSubstr("model.safetensors"));
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFileFails) {
  WriteRaw("model.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcd",
           1000);
  EXPECT_THAT(OpenError().message(), HasSubstr("model.safetensors"));
  WriteRaw("model.safetensors", "{}", "", ~uint64_t{0});
  EXPECT_THAT(OpenError().message(), HasSubstr("model.safetensors"));
}

TEST_F(SafetensorsTest, BadHeaderJsonFails) {
  WriteRaw("model.safetensors", R"({"a":{"dtype":"F32",)", "abcd");
  EXPECT_THAT(OpenError().message(), HasSubstr("model.safetensors"));
  WriteRaw("model.safetensors", R"([1, 2, 3])", "");
  EXPECT_THAT(OpenError().message(), HasSubstr("model.safetensors"));
  WriteRaw("model.safetensors", R"({"a": 5})", "");
  EXPECT_THAT(OpenError().message(), HasSubstr("\"a\""));
}

TEST_F(SafetensorsTest, UnsupportedDtypeNamesDtypeTensorAndFile) {
  WriteRaw("model.safetensors", R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
           std::string(8, '\0'));
  absl::Status s = OpenError();
  EXPECT_THAT(s.message(), HasSubstr("I64"));
  EXPECT_THAT(s.message(), HasSubstr("ids"));
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
}

TEST_F(SafetensorsTest, OffsetsOutOfRangeFail) {
  WriteRaw("model.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           std::string(8, '\0'));
  absl::Status s = OpenError();
  EXPECT_THAT(s.message(), HasSubstr("\"w\""));
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
  WriteRaw("model.safetensors", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
           std::string(8, '\0'));
  EXPECT_THAT(OpenError().message(), HasSubstr("\"w\""));
  WriteRaw("model.safetensors", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})",
           std::string(8, '\0'));
  EXPECT_THAT(OpenError().message(), HasSubstr("\"w\""));
}

TEST_F(SafetensorsTest, ShapeSizeMismatchFails) {
  WriteRaw("model.safetensors", R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})",
           std::string(8, '\0'));
  absl::Status s = OpenError();
  EXPECT_THAT(s.message(), HasSubstr("\"w\""));
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
  // A shape whose element count overflows must not wrap around to a small size.
  WriteRaw("model.safetensors",
           R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}})", "");
  EXPECT_THAT(OpenError().message(), HasSubstr("\"w\""));
  // Found by fuzz/safetensors_fuzz.cc: after a zero dimension the element count stays 0, and a
  // dimension above 2^63 - 1 was accepted and read back as a negative one.
  WriteRaw("model.safetensors",
           R"({"w":{"dtype":"F32","shape":[0,18446744073709551615],"data_offsets":[0,0]}})", "");
  EXPECT_THAT(OpenError().message(), HasSubstr("above 2^63 - 1"));
  WriteRaw("model.safetensors", R"({"w":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]}})", "");
  EXPECT_TRUE(TensorStore::Open(dir_.string()).ok());
}

TEST_F(SafetensorsTest, WrongShapeNamesTensorAndFile) {
  std::map<std::string, TensorToWrite> t;
  t["model.norm.weight"] = {DType::kF32, {4}, std::vector<uint8_t>(16)};
  ASSERT_TRUE(WriteSafetensors((dir_ / "model.safetensors").string(), t).ok());
  absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  absl::StatusOr<TensorView> v = (*store)->GetWithShape("model.norm.weight", {8});
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(v.status().message(), HasSubstr("model.norm.weight"));
  EXPECT_THAT(v.status().message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(v.status().message(), HasSubstr("[4]"));
  EXPECT_THAT(v.status().message(), HasSubstr("[8]"));
}

}  // namespace
}  // namespace tandem
