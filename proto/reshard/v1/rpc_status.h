// The usage-error mark (IsUsageError, lib/core/status.h) on the reshard.v1 API's refusals.
//
// A call refused for a flag (JobSpec field) given to a job that does not read it answers
// INVALID_ARGUMENT with the trailing metadata `reshard-usage-error: FLAG` (reshardctl's name
// of the field, e.g. "--family"). Other refusals, INVALID_ARGUMENT ones included, carry no such
// key, so a client exits 2 (usage) for exactly the refusals reshardctl gives 2 in-process.

#ifndef RESHARD_PROTO_RESHARD_V1_RPC_STATUS_H_
#define RESHARD_PROTO_RESHARD_V1_RPC_STATUS_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace reshard {

inline constexpr char kUsageErrorMetadataKey[] = "reshard-usage-error";

// Adds the usage-error mark of `status`, when it has one, to the call's trailing metadata.
void SendUsageErrorMark(const absl::Status& status, grpc::ServerContext& context);

// The status of a finished call (same code and message), marked as a usage error when the
// server's trailing metadata (in `context`) carries the mark.
absl::Status StatusFromRpc(const grpc::Status& status, const grpc::ClientContext& context);

}  // namespace reshard

#endif  // RESHARD_PROTO_RESHARD_V1_RPC_STATUS_H_
