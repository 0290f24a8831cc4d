// Status helpers shared by every layer of reshard.
//
// Every error that leaves a layer carries the context that layer knows: the file path, the
// tensor name, the byte offset. `Annotate` prefixes that context while keeping the code, so a
// message reads outermost-first: "reading /ckpt/model.safetensors: tensor \"w\": ...".

#ifndef RESHARD_LIB_CORE_STATUS_H_
#define RESHARD_LIB_CORE_STATUS_H_

#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace reshard {

// Returns `status` with `context` prefixed to its message; OK stays OK. The code is kept.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// Converts an errno value from a failed system call into a status naming the operation.
// ENOENT -> NotFound, EACCES/EPERM -> PermissionDenied, ENOSPC/EDQUOT/ENOMEM -> ResourceExhausted,
// everything else -> Internal.
absl::Status ErrnoToStatus(int error_number, absl::string_view what);

// A usage error refuses a flag (a JobSpec field) given to a job that does not read it;
// reshardctl exits 2 for it, in-process and through reshardd alike. The mark is a payload of
// the status, so it survives Annotate and travels to clients (proto/reshard/v1/rpc_status.h).

// `status` marked as a usage error that refuses `flag` (reshardctl's name, e.g. "--family").
absl::Status MarkUsageError(absl::Status status, absl::string_view flag);

// Whether `status` is marked as a usage error.
bool IsUsageError(const absl::Status& status);

// The flag a usage error refuses; nullopt when `status` is not one.
std::optional<std::string> UsageErrorFlag(const absl::Status& status);

}  // namespace reshard

#define RESHARD_STATUS_CONCAT_INNER_(a, b) a##b
#define RESHARD_STATUS_CONCAT_(a, b) RESHARD_STATUS_CONCAT_INNER_(a, b)

// Picks the macro for 1, 2 or 3 arguments.
#define RESHARD_STATUS_MACRO_BY_ARGS_(_1, _2, _3, NAME, ...) NAME

// `RETURN_IF_ERROR(expr);` returns from the current function if `expr` (an absl::Status) is not
// OK. `RETURN_IF_ERROR(expr, context);` returns it with `context` prefixed (Annotate).
#define RETURN_IF_ERROR(...)                                                         \
  RESHARD_STATUS_MACRO_BY_ARGS_(__VA_ARGS__, RESHARD_STATUS_UNUSED_,                 \
                                RESHARD_RETURN_IF_ERROR_ANNOTATED_, RESHARD_RETURN_IF_ERROR_) \
  (__VA_ARGS__)

#define RESHARD_RETURN_IF_ERROR_(expr) RESHARD_RETURN_IF_ERROR_ANNOTATED_(expr, "")

#define RESHARD_RETURN_IF_ERROR_ANNOTATED_(expr, context)            \
  do {                                                               \
    ::absl::Status reshard_status_macro_value_ = (expr);             \
    if (!reshard_status_macro_value_.ok()) {                         \
      return ::reshard::Annotate(reshard_status_macro_value_, context); \
    }                                                                \
  } while (false)

// `ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());` assigns the value or returns the
// error status from the current function; `ASSIGN_OR_RETURN(auto x, expr, context);` returns
// it with `context` prefixed (Annotate).
#define ASSIGN_OR_RETURN(...)                                                          \
  RESHARD_STATUS_MACRO_BY_ARGS_(__VA_ARGS__, RESHARD_ASSIGN_OR_RETURN_ANNOTATED_,      \
                                RESHARD_ASSIGN_OR_RETURN_, RESHARD_STATUS_UNUSED_)     \
  (__VA_ARGS__)

#define RESHARD_ASSIGN_OR_RETURN_(lhs, expr) RESHARD_ASSIGN_OR_RETURN_ANNOTATED_(lhs, expr, "")

#define RESHARD_ASSIGN_OR_RETURN_ANNOTATED_(lhs, expr, context)                               \
  RESHARD_ASSIGN_OR_RETURN_IMPL_(RESHARD_STATUS_CONCAT_(reshard_statusor_, __LINE__), lhs, expr, \
                                 context)

#define RESHARD_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr, context) \
  auto statusor = (expr);                                            \
  if (!statusor.ok()) {                                              \
    return ::reshard::Annotate(std::move(statusor).status(), context); \
  }                                                                  \
  lhs = *std::move(statusor)

#endif  // RESHARD_LIB_CORE_STATUS_H_
