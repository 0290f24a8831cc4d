// The reshard.v1.Reshard gRPC service: thin handlers that validate a request, translate it to
// scheduler or engine calls, and convert the resulting status once (ToGrpcStatus below; a
// usage error's mark goes in the trailing metadata, proto/reshard/v1/rpc_status.h).

#ifndef RESHARD_SERVER_SERVICE_H_
#define RESHARD_SERVER_SERVICE_H_

#include <atomic>

#include "absl/status/statusor.h"
#include "lib/engine/spec_codec.h"
#include "proto/reshard/v1/reshard.grpc.pb.h"
#include "server/auth_tokens.h"
#include "server/offload_pool.h"
#include "server/path_policy.h"
#include "server/scheduler.h"

namespace reshard {

// Request limits (rules: kMaxRulesJsonBytes, lib/engine/spec_codec.h). gRPC's own message cap
// is set from kMaxRequestBytes by the server.
inline constexpr size_t kMaxRequestBytes = 2 << 20;
inline constexpr size_t kMaxIdempotencyKeyBytes = 256;

// Checks a spec and returns it with its paths resolved (the canonical form stored with the
// job). InvalidArgument names the field; PermissionDenied for paths outside the roots (also
// through symlinks inside an input folder). Whether the output is free is checked separately
// (CheckOutputUsable, lib/engine/partitioned_conversion.h), since a resubmission of a finished job must still find that job.
absl::StatusOr<v1::JobSpec> ValidateJobSpec(const v1::JobSpec& spec, const PathPolicy& paths);

// With an Authorizer, every call first authorizes its bearer token (scope per call, see
// server/auth_tokens.h), paths are checked against the token's roots, jobs are recorded with
// the token's name and other tokens' jobs answer NOT_FOUND (unless admin), and SubmitJob and
// CancelJob write an audit line to stderr (token name, call, peer, paths, job, result).
class ReshardService final : public v1::Reshard::Service {
 public:
  // `auth` may be null: then every caller may do everything under the daemon's roots.
  ReshardService(Scheduler* scheduler, const PathPolicy* paths, OffloadPool* offload,
                 const Authorizer* auth = nullptr)
      : scheduler_(scheduler), paths_(paths), offload_(offload), auth_(auth) {}

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
  // The caller of `context` (its bearer token).
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContext& context) const;
  // The caller of `context` if it may use `scope`.
  absl::StatusOr<Caller> Authorize(const grpc::ServerContext& context, Scope scope) const;
  absl::StatusOr<v1::Job> Submit(grpc::ServerContext& context, const Caller& caller,
                                 const v1::SubmitJobRequest& request);
  // The job `id` if `caller` may see it (NotFound otherwise, as for an unknown id).
  absl::StatusOr<v1::Job> VisibleJob(const Caller& caller, const std::string& id) const;
  // One audit line for a mutating call (with tokens only).
  void Audit(const grpc::ServerContext& context, const absl::StatusOr<Caller>& caller,
             absl::string_view call, absl::string_view details, const absl::Status& result) const;

  Scheduler* const scheduler_;
  const PathPolicy* const paths_;
  OffloadPool* const offload_;
  const Authorizer* const auth_;
};

// absl::Status -> grpc::Status (same code numbers; message truncated to 1 KiB).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace reshard

#endif  // RESHARD_SERVER_SERVICE_H_
