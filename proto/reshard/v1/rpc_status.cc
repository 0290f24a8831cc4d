#include "proto/reshard/v1/rpc_status.h"

#include <optional>
#include <string>

#include "lib/core/status.h"

namespace reshard {

void SendUsageErrorMark(const absl::Status& status, grpc::ServerContext& context) {
  const std::optional<std::string> flag = UsageErrorFlag(status);
  if (flag.has_value()) context.AddTrailingMetadata(kUsageErrorMetadataKey, *flag);
}

absl::Status StatusFromRpc(const grpc::Status& status, const grpc::ClientContext& context) {
  if (status.ok()) return absl::OkStatus();
  absl::Status converted(static_cast<absl::StatusCode>(status.error_code()),
                         status.error_message());
  const auto& trailing = context.GetServerTrailingMetadata();
  const auto mark = trailing.find(kUsageErrorMetadataKey);
  if (mark == trailing.end()) return converted;
  return MarkUsageError(std::move(converted),
                        absl::string_view(mark->second.data(), mark->second.size()));
}

}  // namespace reshard
