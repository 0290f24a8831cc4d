#include "lib/core/status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace reshard {
namespace {

// The payload of a usage error's mark; its value is the flag refused.
constexpr absl::string_view kUsageErrorUrl = "reshard/usage-error";

}  // namespace

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok() || context.empty()) return status;
  absl::Status annotated(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
    annotated.SetPayload(url, payload);
  });
  return annotated;
}

absl::Status MarkUsageError(absl::Status status, absl::string_view flag) {
  if (!status.ok()) status.SetPayload(kUsageErrorUrl, absl::Cord(flag));
  return status;
}

bool IsUsageError(const absl::Status& status) {
  return status.GetPayload(kUsageErrorUrl).has_value();
}

std::optional<std::string> UsageErrorFlag(const absl::Status& status) {
  const auto flag = status.GetPayload(kUsageErrorUrl);  // absl::optional<absl::Cord>
  if (!flag.has_value()) return std::nullopt;
  return std::string(*flag);
}

absl::Status ErrnoToStatus(int error_number, absl::string_view what) {
  std::string message = absl::StrCat(what, ": ", std::strerror(error_number));
  switch (error_number) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    case EEXIST:
    case ENOTEMPTY:
    case ELOOP:  // a symlink loop: the path cannot be resolved as the filesystem stands
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace reshard
