// The reshard.v1.Reshard gRPC service: thin handlers that validate a request, translate it to
// scheduler or engine calls, and convert the resulting status once (see grpc_status.h).

#ifndef RESHARD_SERVER_SERVICE_H_
#define RESHARD_SERVER_SERVICE_H_

#include <atomic>

#include "absl/status/statusor.h"
#include "proto/reshard/v1/reshard.grpc.pb.h"
#include "server/offload_pool.h"
#include "server/path_policy.h"
#include "server/scheduler.h"

namespace reshard {

// Request limits. gRPC's own message cap is set from kMaxRequestBytes by the server.
inline constexpr size_t kMaxRequestBytes = 2 << 20;
inline constexpr size_t kMaxRulesJsonBytes = 1 << 20;
inline constexpr size_t kMaxIdempotencyKeyBytes = 256;

// Checks a spec and returns it with its paths resolved (the canonical form stored with the
// job). InvalidArgument names the field; PermissionDenied for paths outside the roots (also
// through symlinks inside an input folder). Whether the output is free is checked separately
// (CheckOutputDirUsable), since a resubmission of a finished job must still find that job.
absl::StatusOr<v1::JobSpec> ValidateJobSpec(const v1::JobSpec& spec, const PathPolicy& paths);

class ReshardService final : public v1::Reshard::Service {
 public:
  ReshardService(Scheduler* scheduler, const PathPolicy* paths, OffloadPool* offload)
      : scheduler_(scheduler), paths_(paths), offload_(offload) {}

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status Plan(grpc::ServerContext* context, const v1::PlanRequest* request,
                    v1::PlanResponse* response) override;
  grpc::Status Inspect(grpc::ServerContext* context, const v1::InspectRequest* request,
                       v1::InspectResponse* response) override;

 private:
  Scheduler* const scheduler_;
  const PathPolicy* const paths_;
  OffloadPool* const offload_;
};

// absl::Status -> grpc::Status (same code numbers; message truncated to 1 KiB).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace reshard

#endif  // RESHARD_SERVER_SERVICE_H_
