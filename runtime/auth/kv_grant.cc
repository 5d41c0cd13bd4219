#include "runtime/auth/kv_grant.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/str_cat.h"
#include "runtime/base/secrets.h"

namespace tandem::auth {
namespace {

constexpr absl::string_view kDomain = "tandem.kv-grant.v1";

void AppendU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void AppendBytes(std::string* out, absl::string_view bytes) {
  AppendU64(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

}  // namespace

absl::StatusOr<std::string> NewGrantKey() { return RandomBytes(kGrantKeyBytes); }

absl::StatusOr<std::string> KvGrant(absl::string_view key, absl::string_view pair_id,
                                    uint64_t epoch, absl::string_view request_id,
                                    int32_t num_cached_tokens,
                                    absl::Span<const int32_t> block_ids) {
  if (key.size() != kGrantKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a grant key is ", kGrantKeyBytes, " bytes, not ", key.size()));
  }
  std::string message;
  message.reserve(64 + pair_id.size() + request_id.size() + 4 * block_ids.size());
  AppendBytes(&message, kDomain);
  AppendBytes(&message, pair_id);
  AppendU64(&message, epoch);
  AppendBytes(&message, request_id);
  AppendU64(&message, static_cast<uint32_t>(num_cached_tokens));
  AppendU64(&message, block_ids.size());
  for (int32_t block : block_ids) AppendU64(&message, static_cast<uint32_t>(block));
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac,
           &mac_len) == nullptr ||
      mac_len != kGrantBytes) {
    return absl::InternalError("HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<const char*>(mac), mac_len);
}

absl::Status VerifyKvGrant(absl::string_view key, absl::string_view grant,
                           absl::string_view pair_id, uint64_t epoch, absl::string_view request_id,
                           int32_t num_cached_tokens, absl::Span<const int32_t> block_ids) {
  absl::StatusOr<std::string> expected =
      KvGrant(key, pair_id, epoch, request_id, num_cached_tokens, block_ids);
  if (!expected.ok()) return expected.status();
  if (!ConstantTimeEquals(grant, *expected)) {
    return absl::PermissionDeniedError(
        "grant: these block ids were not granted by the decode worker for this request and "
        "epoch");
  }
  return absl::OkStatus();
}

}  // namespace tandem::auth
