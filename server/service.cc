#include "server/service.h"

#include <iostream>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/engine/conversion.h"
#include "lib/engine/partition_spec.h"
#include "lib/engine/partitioned_conversion.h"
#include "lib/engine/spec_codec.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/hf/hf_output.h"
#include "lib/formats/hf/model_files.h"
#include "lib/formats/torch/pickle.h"
#include "lib/io/io_mode.h"
#include "lib/plan/partition_rules.h"
#include "proto/reshard/v1/job_spec_codec.h"
#include "proto/reshard/v1/rpc_status.h"
#include "server/job_runner.h"

namespace reshard {
namespace {

static_assert(static_cast<int>(absl::StatusCode::kDataLoss) ==
              static_cast<int>(grpc::StatusCode::DATA_LOSS));
static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
              static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));

constexpr size_t kMaxMessageOnWire = 1024;

// Runs `work` on the offload pool and waits for it until the call's deadline or cancellation.
// `work` must own what it touches: it may still run after this returns.
absl::Status RunOffloaded(OffloadPool& pool, grpc::ServerContext& context,
                          std::function<void()> work) {
  const auto deadline = context.deadline();
  const absl::Time until = deadline == std::chrono::system_clock::time_point::max()
                               ? absl::InfiniteFuture()
                               : absl::FromChrono(deadline);
  return pool.Run(std::move(work), until, [&context] { return context.IsCancelled(); });
}

// Reserves the metadata allowance of an Inspect or Plan call (an eighth of the daemon's memory
// budget) and makes the allowance the pickles it parses are charged to. ResourceExhausted at
// once when running jobs leave the budget no room.
struct MetadataWork {
  std::unique_ptr<MemoryReservation> reservation;
  std::shared_ptr<MetadataAllowance> allowance;
};
absl::StatusOr<std::shared_ptr<MetadataWork>> ReserveMetadataWork(Scheduler& scheduler,
                                                                 absl::string_view call) {
  const uint64_t bytes = scheduler.memory_budget() / 8;
  auto work = std::make_shared<MetadataWork>();
  ASSIGN_OR_RETURN(work->reservation, scheduler.ReserveNow(bytes, call));
  work->allowance = std::make_shared<MetadataAllowance>(bytes);
  return work;
}

// A path for a log line: quoted, control characters escaped.
std::string Quoted(absl::string_view path) {
  return absl::StrCat("\"", absl::CHexEscape(path), "\"");
}

}  // namespace

absl::StatusOr<Caller> ReshardService::Authenticate(const grpc::ServerContext& context) const {
  if (auth_ == nullptr) {
    Caller anyone;
    anyone.scopes = ~0u;
    anyone.paths = std::shared_ptr<const PathPolicy>(std::shared_ptr<void>(), paths_);
    return anyone;
  }
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  absl::string_view header;
  if (it != metadata.end()) header = absl::string_view(it->second.data(), it->second.size());
  return auth_->Authenticate(header);
}

absl::StatusOr<Caller> ReshardService::Authorize(const grpc::ServerContext& context,
                                                 Scope scope) const {
  ASSIGN_OR_RETURN(Caller caller, Authenticate(context));
  RETURN_IF_ERROR(RequireScope(caller, scope));
  return caller;
}

absl::StatusOr<v1::Job> ReshardService::VisibleJob(const Caller& caller,
                                                   const std::string& id) const {
  // A request without an id is malformed, not a question about a job that does not exist.
  if (id.empty()) return absl::InvalidArgumentError("the request names no job (id is empty)");
  ASSIGN_OR_RETURN(v1::Job job, scheduler_->Get(id));
  if (!caller.Owns(job.owner())) return absl::NotFoundError(absl::StrCat("no job \"", id, "\""));
  return job;
}

void ReshardService::Audit(const grpc::ServerContext& context, const absl::StatusOr<Caller>& caller,
                           absl::string_view call, absl::string_view details,
                           const absl::Status& result) const {
  if (auth_ == nullptr) return;
  const std::string line =
      absl::StrCat("reshardd: audit: token=", caller.ok() ? caller->name : "-", " call=", call,
                   " peer=", context.peer(), details.empty() ? "" : " ", details,
                   " result=", absl::StatusCodeToString(result.code()), "\n");
  std::cerr << line << std::flush;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (message.size() > kMaxMessageOnWire) message = message.substr(0, kMaxMessageOnWire) + "...";
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message);
}

absl::StatusOr<v1::JobSpec> ValidateJobSpec(const v1::JobSpec& spec, const PathPolicy& paths) {
  v1::JobSpec valid = spec;
  // The conversion's fields: the spec codec's rows, named as JobSpec fields.
  ASSIGN_OR_RETURN(const ConversionSpec conversion, ConversionSpecFromProto(spec));
  RETURN_IF_ERROR(ValidateSpec(conversion, SpecNaming::kProto));
  // The job's own.
  if (spec.priority() < -100 || spec.priority() > 100) {
    return absl::InvalidArgumentError("spec.priority must be in [-100, 100]");
  }
  if (spec.output().empty()) return absl::InvalidArgumentError("spec.output is required");
  if (spec.input().empty()) return absl::InvalidArgumentError("spec.input is required");
  ASSIGN_OR_RETURN(*valid.mutable_input(), paths.CheckInputTree(spec.input()));
  // --tokenizer DIR is read like the input: inside the caller's roots, no link out of them.
  if (!spec.tokenizer().empty()) {
    ASSIGN_OR_RETURN(*valid.mutable_tokenizer(), paths.CheckInputTree(spec.tokenizer()),
                     "spec.tokenizer");
  }
  // --config FILE is read like the input too: a file inside the caller's roots.
  if (!spec.hf_config_file().empty()) {
    ASSIGN_OR_RETURN(*valid.mutable_hf_config_file(), paths.CheckInput(spec.hf_config_file()),
                     "spec.hf_config_file");
  }
  ASSIGN_OR_RETURN(*valid.mutable_output(), paths.CheckOutput(spec.output()));
  // Neither may hold the other: the output would be read back as input, or written into it.
  if (valid.output() == valid.input() || valid.input().rfind(valid.output() + "/", 0) == 0 ||
      valid.output().rfind(valid.input() + "/", 0) == 0) {
    return absl::InvalidArgumentError("spec.output must not be, contain or lie inside the input");
  }
  return valid;
}

grpc::Status ReshardService::SubmitJob(grpc::ServerContext* context,
                                       const v1::SubmitJobRequest* request, v1::Job* response) {
  // Authenticated first, so that the audit line names a token that lacks the scope.
  const absl::StatusOr<Caller> caller = Authenticate(*context);
  absl::StatusOr<v1::Job> job =
      caller.ok() ? Submit(*context, *caller, *request) : absl::StatusOr<v1::Job>(caller.status());
  Audit(*context, caller, "SubmitJob",
        absl::StrCat("input=", Quoted(request->spec().input()),
                     " output=", Quoted(request->spec().output()),
                     job.ok() ? absl::StrCat(" job=", job->id()) : ""),
        job.status());
  if (!job.ok()) {
    SendUsageErrorMark(job.status(), *context);
    return ToGrpcStatus(job.status());
  }
  *response = *std::move(job);
  return grpc::Status::OK;
}

absl::StatusOr<v1::Job> ReshardService::Submit(grpc::ServerContext& context, const Caller& caller,
                                               const v1::SubmitJobRequest& request) {
  RETURN_IF_ERROR(RequireScope(caller, Scope::kSubmit));
  if (request.idempotency_key().size() > kMaxIdempotencyKeyBytes) {
    return absl::InvalidArgumentError("idempotency_key is longer than 256 bytes");
  }
  // A new job needs a free output; a resubmission (same key) gets its job back whatever the
  // output holds now, so a requeued task re-attaches even after the job finished.
  // A partition's output may already be its split's, published by the worker that finished
  // last: the job itself tells that apart from someone else's folder.
  const bool needs_free_output =
      !request.spec().overwrite() && request.spec().partition_count() == 0 &&
      !scheduler_->HasIdempotencyKey(request.idempotency_key(), caller.name);
  // The path checks touch the filesystem: off the gRPC thread, bounded by the deadline. The
  // task owns its copies (it may outlive this call; the policy outlives the pool).
  auto checked = std::make_shared<std::optional<absl::StatusOr<v1::JobSpec>>>();
  absl::Status waited = RunOffloaded(
      *offload_, context,
      [checked, spec = request.spec(), needs_free_output, paths = caller.paths] {
        absl::StatusOr<v1::JobSpec> valid = ValidateJobSpec(spec, *paths);
        if (valid.ok() && needs_free_output) {
          // An s3:// prefix: one LIST with the daemon's credentials.
          absl::StatusOr<ConversionSpec> conversion = ConversionSpecFromProto(*valid);
          absl::Status free =
              conversion.ok() ? CheckOutputUsable(*conversion) : conversion.status();
          if (!free.ok()) valid = free;
        }
        *checked = std::move(valid);
      });
  if (!waited.ok()) return waited;
  if (!checked->has_value()) return absl::UnavailableError("the daemon is stopping; not checked");
  const absl::StatusOr<v1::JobSpec>& spec = **checked;
  if (!spec.ok()) return spec.status();
  return scheduler_->Submit(*spec, request.idempotency_key(), caller.name);
}

grpc::Status ReshardService::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                    v1::Job* response) {
  const absl::StatusOr<Caller> caller = Authorize(*context, Scope::kRead);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  auto job = VisibleJob(*caller, request->id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status ReshardService::ListJobs(grpc::ServerContext* context,
                                      const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  const absl::StatusOr<Caller> caller = Authorize(*context, Scope::kRead);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  std::vector<v1::JobState> states;
  for (int i = 0; i < request->states_size(); ++i) {
    const int state = request->states(i);
    // Refused rather than matching nothing, which would read as "no such jobs".
    if (!v1::JobState_IsValid(state) || state == v1::JOB_STATE_UNSPECIFIED) {
      return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
          "states[", i, "] = ", state,
          " is not a job state (expected QUEUED, RUNNING, SUCCEEDED, FAILED or CANCELLED)")));
    }
    states.push_back(static_cast<v1::JobState>(state));
  }
  auto page = scheduler_->List(states, request->page_size(), request->page_token(),
                               caller->Has(Scope::kAdmin) ? nullptr : &caller->name);
  if (!page.ok()) return ToGrpcStatus(page.status());
  for (v1::Job& job : page->jobs) *response->add_jobs() = std::move(job);
  response->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

grpc::Status ReshardService::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* request, v1::Job* response) {
  const absl::StatusOr<Caller> caller = Authenticate(*context);
  absl::StatusOr<v1::Job> job = [&]() -> absl::StatusOr<v1::Job> {
    if (!caller.ok()) return caller.status();
    RETURN_IF_ERROR(RequireScope(*caller, Scope::kCancel));
    RETURN_IF_ERROR(VisibleJob(*caller, request->id()).status());
    return scheduler_->Cancel(request->id());
  }();
  Audit(*context, caller, "CancelJob",
        absl::StrCat("job=", Quoted(request->id()),
                     job.ok() ? absl::StrCat(" input=", Quoted(job->spec().input()),
                                             " output=", Quoted(job->spec().output()))
                              : ""),
        job.status());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status ReshardService::WatchJob(grpc::ServerContext* context,
                                      const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::JobEvent>* writer) {
  const absl::StatusOr<Caller> caller = Authorize(*context, Scope::kRead);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  // Ownership never changes: checked once.
  if (auto visible = VisibleJob(*caller, request->id()); !visible.ok()) {
    return ToGrpcStatus(visible.status());
  }
  int64_t version = -1;
  while (!context->IsCancelled()) {
    auto job = scheduler_->WaitForChange(request->id(), &version, absl::Seconds(1));
    if (!job.ok()) return ToGrpcStatus(job.status());
    v1::JobEvent event;
    *event.mutable_job() = *job;
    if (!writer->Write(event)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    if (IsTerminal(job->state())) return grpc::Status::OK;
    if (scheduler_->stopping()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the daemon is shutting down");
    }
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled the watch");
}

grpc::Status ReshardService::Plan(grpc::ServerContext* context, const v1::PlanRequest* request,
                                  v1::PlanResponse* response) {
  const absl::StatusOr<Caller> caller = Authorize(*context, Scope::kRead);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  v1::JobSpec spec = request->spec();
  spec.set_overwrite(true);  // a dry run does not care whether the output exists yet
  // Shared with the task, which may outlive this call (the policy outlives the pool).
  auto planned = std::make_shared<std::optional<absl::StatusOr<PlannedConversion>>>();
  absl::StatusOr<std::shared_ptr<MetadataWork>> metadata =
      ReserveMetadataWork(*scheduler_, "Plan");
  if (!metadata.ok()) return ToGrpcStatus(metadata.status());
  absl::Status waited = RunOffloaded(*offload_, *context, [planned, spec, paths = caller->paths,
                                                           metadata = *std::move(metadata)] {
    ScopedMetadataAllowance allowance(metadata->allowance);
    absl::StatusOr<v1::JobSpec> valid = ValidateJobSpec(spec, *paths);
    if (!valid.ok()) {
      *planned = valid.status();
      return;
    }
    ScopedPathConfinement confined(paths->confinement());
    absl::StatusOr<ConversionSpec> conversion = ConversionSpecFromProto(*valid);
    *planned = conversion.ok() ? PlanConversion(*conversion)
                               : absl::StatusOr<PlannedConversion>(conversion.status());
  });
  if (!waited.ok()) return ToGrpcStatus(waited);
  if (!planned->has_value()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the daemon is stopping; plan not made");
  }
  const absl::StatusOr<PlannedConversion>& plan_result = **planned;
  if (!plan_result.ok()) {
    SendUsageErrorMark(plan_result.status(), *context);
    return ToGrpcStatus(plan_result.status());
  }
  for (const FilePlan& file : plan_result->plan.files) {
    v1::PlannedFile* out = response->add_files();
    out->set_name(file.name);
    out->set_bytes(file.bytes);
    out->set_tensors(static_cast<int>(file.tensors.size()));
  }
  for (const auto& [name, contents] : plan_result->companion_files) {
    v1::PlannedFile* out = response->add_files();
    out->set_name(name);
    out->set_bytes(contents.size());
  }
  response->set_data_files(static_cast<uint32_t>(plan_result->plan.files.size()));
  response->set_total_bytes(plan_result->plan.total_bytes);
  response->set_source_bytes_read(plan_result->plan.source_bytes_read);
  response->set_memory_bytes(plan_result->memory_bytes);  // as the local plan reports it
  return grpc::Status::OK;
}

grpc::Status ReshardService::Inspect(grpc::ServerContext* context,
                                     const v1::InspectRequest* request,
                                     v1::InspectResponse* response) {
  const absl::StatusOr<Caller> caller = Authorize(*context, Scope::kRead);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (request->rules_json().size() > kMaxRulesJsonBytes) {
    return ToGrpcStatus(absl::InvalidArgumentError("rules_json is larger than 1 MiB"));
  }
  // The task owns its request and its answer: it may outlive this call (the policy outlives
  // the pool).
  struct Answer {
    v1::InspectRequest request;
    absl::Status status;
    v1::InspectResponse response;
  };
  auto answer = std::make_shared<Answer>();
  answer->request = *request;
  absl::StatusOr<std::shared_ptr<MetadataWork>> metadata =
      ReserveMetadataWork(*scheduler_, "Inspect");
  if (!metadata.ok()) return ToGrpcStatus(metadata.status());
  absl::Status waited = RunOffloaded(*offload_, *context, [answer, paths = caller->paths,
                                                           metadata = *std::move(metadata)] {
    ScopedMetadataAllowance allowance(metadata->allowance);
    const v1::InspectRequest* request = &answer->request;
    v1::InspectResponse* response = &answer->response;
    absl::Status& status = answer->status;
    absl::StatusOr<std::string> input = paths->CheckInputTree(request->input());
    if (!input.ok()) {
      status = input.status();
      return;
    }
    ScopedPathConfinement confined(paths->confinement());
    auto rules = LoadRules(request->rules_json(), "");
    if (!rules.ok()) {
      status = rules.status();
      return;
    }
    ReadOptions read;
    read.tag = request->tag();
    read.include_optimizer = request->include_optimizer();
    auto loaded = LoadInput(*input, *std::move(rules), /*require_model=*/false, read);
    if (!loaded.ok()) {
      status = loaded.status();
      return;
    }
    response->set_description(WithHfFamilyNote(loaded->model, loaded->catalog));
    if (const std::optional<HfExportNote> hf = DescribeHfExport(loaded->model, loaded->catalog, *input)) {
      response->set_hf_export_family(hf->family);
      response->set_hf_export_note(hf->note);
    }
    absl::StatusOr<std::vector<ModelFile>> model_files =
        InputModelFiles(*input, loaded->model.format);
    if (!model_files.ok()) {
      status = model_files.status();
      return;
    }
    for (const ModelFile& file : *model_files) {
      v1::InputFile* out = response->add_model_files();
      out->set_path(file.path);
      out->set_bytes(file.size);
    }
    const Catalog& shown = loaded->merged ? loaded->catalog : loaded->model.parts[0];
    response->set_format(loaded->model.format);
    response->set_layout(loaded->model.arrangement);
    response->set_parts(static_cast<int>(loaded->model.parts.size()));
    response->set_merged(loaded->merged);
    for (const Catalog& part : loaded->model.parts) {
      for (const SourceFile& file : part.files) {
        v1::InputFile* out = response->add_files();
        out->set_path(file.path);
        out->set_bytes(file.size);
      }
    }
    uint64_t total = 0;
    for (const CatalogTensor& tensor : shown.tensors) {
      v1::TensorInfo* info = response->add_tensors();
      info->set_name(tensor.name);
      info->set_dtype(std::string(DTypeName(tensor.dtype)));
      for (int64_t extent : tensor.shape) info->add_shape(extent);
      info->set_bytes(TensorBytes(tensor));
      info->set_pieces(static_cast<int>(tensor.pieces.size()));
      total += TensorBytes(tensor);
    }
    response->set_total_bytes(total);
    for (const auto& [key, value] : shown.metadata) (*response->mutable_metadata())[key] = value;
  });
  if (!waited.ok()) return ToGrpcStatus(waited);
  if (!answer->status.ok()) return ToGrpcStatus(answer->status);
  *response = std::move(answer->response);
  return grpc::Status::OK;
}

}  // namespace reshard
