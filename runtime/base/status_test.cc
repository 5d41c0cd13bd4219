#include "runtime/base/status.h"

#include <memory>

#include "gtest/gtest.h"

namespace tandem {
namespace {

absl::StatusOr<std::unique_ptr<int>> MakeInt(bool ok) {
  if (!ok) return absl::InvalidArgumentError("no int");
  return std::make_unique<int>(7);
}

absl::Status UseInt(bool ok, int* out) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> v, MakeInt(ok));
  *out = *v;
  return absl::OkStatus();
}

absl::Status Chain(bool ok) {
  int v = 0;
  RETURN_IF_ERROR(UseInt(ok, &v));
  return v == 7 ? absl::OkStatus() : absl::InternalError("bad value");
}

TEST(StatusMacros, PropagateErrorsAndMoveValues) {
  EXPECT_TRUE(Chain(true).ok());
  absl::Status s = Chain(false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "no int");
}

}  // namespace
}  // namespace tandem
