// reshardctl's commands that go through reshardd (see commands.h).

#include <unistd.h>
#include <xxhash.h>

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "client/commands.h"
#include "client/exit_codes.h"
#include "client/progress_bar.h"
#include "client/reports.h"
#include "lib/core/status.h"
#include "lib/engine/partition_spec.h"
#include "lib/engine/spec_codec.h"
#include "lib/io/file_access.h"
#include "lib/plan/layout_builders.h"
#include "proto/reshard/v1/job_spec_codec.h"

namespace reshard {
namespace {

absl::StatusOr<std::unique_ptr<Client>> ConnectTo(const DaemonFlags& daemon) {
  ClientOptions options;
  options.address = daemon.server;
  options.tls_ca = daemon.tls_ca;
  options.tls_cert = daemon.tls_cert;
  options.tls_key = daemon.tls_key;
  options.token = daemon.token;
  if (!daemon.token_file.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadSmallFile(daemon.token_file, 64 << 10), "--token-file");
    options.token = std::string(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
    if (options.token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file ", daemon.token_file, " holds no token on its first line"));
    }
  }
  return Client::Connect(options);
}

}  // namespace

absl::StatusOr<v1::JobSpec> JobSpecFromFlags(const ConversionFlags& conversion, bool reshard,
                                             const DaemonFlags& daemon, bool* usage) {
  ASSIGN_OR_RETURN(const ConversionSpec spec, ConversionSpecFromFlags(conversion, reshard, usage));
  v1::JobSpec job = JobSpecFromConversionSpec(spec);
  if (!daemon.memory_budget.empty()) {
    absl::StatusOr<uint64_t> budget = ParseByteSize(daemon.memory_budget);
    if (usage != nullptr) *usage = !budget.ok();
    if (!budget.ok()) return Annotate(budget.status(), "--memory-budget");
    job.set_memory_budget(*budget);
  }
  job.set_priority(daemon.priority);
  return job;
}

namespace {

int ExitCodeForJob(const v1::Job& job) {
  switch (job.state()) {
    case v1::JOB_STATE_SUCCEEDED:
      return kExitOk;
    case v1::JOB_STATE_CANCELLED:
      return kExitCancelled;
    case v1::JOB_STATE_FAILED:
      // A flag the job does not read, refused once the input was read: a usage error, as
      // in-process.
      if (job.error().usage_error()) return kExitUsage;
      return ExitCodeForStatus(
          absl::Status(static_cast<absl::StatusCode>(job.error().code()), job.error().message()));
    default:
      return kExitOk;  // queued or running (detached, status)
  }
}

Progress ProgressOf(const v1::Job& job) {
  Progress p;
  p.bytes_done = job.progress().bytes_done();
  p.bytes_total = job.progress().bytes_total();
  p.tensors_done = job.progress().tensors_done();
  p.tensors_total = job.progress().tensors_total();
  p.files_done = job.progress().files_done();
  p.files_total = job.progress().files_total();
  return p;
}

// Follows a job to its end with a progress display, then reports it.
int FollowJob(Client& client, const v1::Job& submitted, const OutputFlags& flags,
              const std::atomic<bool>* stop, std::ostream& out, std::ostream& err) {
  ProgressBar bar(err, flags.terminal);
  auto final_job = client.Watch(
      submitted.id(),
      [&](const v1::Job& job) {
        if (flags.progress && job.state() == v1::JOB_STATE_RUNNING &&
            job.progress().bytes_total() > 0) {
          bar.Update(ProgressOf(job));
        }
      },
      stop);
  if (flags.progress) bar.Finish();
  if (!final_job.ok()) {
    if (absl::IsCancelled(final_job.status())) {
      err << "reshardctl: stopped waiting; job " << submitted.id()
          << " goes on in reshardd (reshardctl cancel " << submitted.id() << " stops it)\n";
    }
    return Fail(final_job.status(), flags, flags.result_file, out, err);
  }
  const int code = ExitCodeForJob(*final_job);
  if (code != kExitOk) {
    err << "reshardctl: job " << final_job->id() << " "
        << JobDocument(*final_job)["state"].get<std::string>() << ": "
        << final_job->error().message() << "\n";
  }
  return Emit(JobDocument(*final_job), code, flags, flags.result_file,
              code == kExitOk ? PrintConversion : PrintJob, out, err);
}

}  // namespace

std::string DefaultIdempotencyKey(const std::string& spec_fingerprint) {
  const char* array_job = std::getenv("SLURM_ARRAY_JOB_ID");
  const char* array_task = std::getenv("SLURM_ARRAY_TASK_ID");
  const char* completion_index = std::getenv("JOB_COMPLETION_INDEX");
  std::string prefix;
  if (array_job != nullptr && array_task != nullptr && *array_job && *array_task) {
    prefix = absl::StrCat("slurm-", array_job, "-", array_task);
  } else if (completion_index != nullptr && *completion_index) {
    // The pod's hostname holds the Job name and the index, stable across retries of the index.
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    std::string name(host);
    // Indexed Job pods are named <job>-<index>-<random>; keep <job>-<index>.
    const size_t last_dash = name.rfind('-');
    if (last_dash != std::string::npos) name = name.substr(0, last_dash);
    prefix = absl::StrCat("k8s-", name, "-", completion_index);
  } else {
    return "";
  }
  return absl::StrCat(prefix, ":", spec_fingerprint);
}

int RunRemoteInspect(const ConversionFlags& conversion, const DaemonFlags& daemon,
                     const OutputFlags& flags, std::ostream& out, std::ostream& err) {
  // The input and rules as a conversion sends them: the path absolute, the rules inline.
  ConversionSpec read;
  read.input = conversion.input;
  read.rules_file = conversion.rules;
  absl::StatusOr<ConversionSpec> sent = NormalizeSpec(std::move(read));
  if (!sent.ok()) return Fail(sent.status(), flags, flags.result_file, out, err);
  auto client = ConnectTo(daemon);
  if (!client.ok()) return Fail(client.status(), flags, flags.result_file, out, err, true);
  auto response = (*client)->Inspect(sent->input, sent->rules_json, conversion.tag,
                                     conversion.include_optimizer);
  if (!response.ok()) return Fail(response.status(), flags, flags.result_file, out, err);
  return Emit(InspectDocument(sent->input, *response), kExitOk, flags, flags.result_file,
              PrintInspect, out, err);
}

int RunRemotePlan(const ConversionFlags& conversion, const DaemonFlags& daemon,
                  const OutputFlags& flags, std::ostream& out, std::ostream& err) {
  const bool reshard = conversion.parts > 0;
  ConversionFlags with_output = conversion;
  if (with_output.output.empty()) {
    // The daemon checks an output even for a dry run: INPUT.plan, beside the input.
    with_output.output = std::string(absl::StripSuffix(conversion.input, "/")) + ".plan";
  }
  bool usage = false;
  auto spec = JobSpecFromFlags(with_output, reshard, daemon, &usage);
  if (!spec.ok()) return Fail(spec.status(), flags, flags.result_file, out, err, usage);
  auto client = ConnectTo(daemon);
  if (!client.ok()) return Fail(client.status(), flags, flags.result_file, out, err, true);
  auto response = (*client)->Plan(*spec);
  if (!response.ok()) return Fail(response.status(), flags, flags.result_file, out, err);
  Json doc = PlanDocument(spec->input(), reshard, *response);
  if (conversion.partitions > 0) {
    AddPartitions(doc, response->data_files(), std::min(conversion.partitions, kMaxPartitions));
  }
  return Emit(doc, kExitOk, flags, flags.result_file, PrintPlan, out, err);
}

int RunRemoteConvert(const ConversionFlags& conversion, bool reshard, const DaemonFlags& daemon,
                     const OutputFlags& flags, const std::atomic<bool>* stop, std::ostream& out,
                     std::ostream& err) {
  bool usage = false;
  auto spec = JobSpecFromFlags(conversion, reshard, daemon, &usage);
  if (!spec.ok()) return Fail(spec.status(), flags, flags.result_file, out, err, usage);
  std::string key = daemon.idempotency_key;
  if (key.empty()) {
    const std::string serialized = spec->SerializeAsString();
    key = DefaultIdempotencyKey(
        absl::StrFormat("%016x", XXH3_64bits(serialized.data(), serialized.size())));
  }
  auto client = ConnectTo(daemon);
  if (!client.ok()) return Fail(client.status(), flags, flags.result_file, out, err, true);
  auto job = (*client)->Submit(*spec, key);
  if (!job.ok()) return Fail(job.status(), flags, flags.result_file, out, err);
  err << "reshardctl: job " << job->id() << " submitted to " << daemon.server
      << (key.empty() ? "" : absl::StrCat(" (idempotency key ", key, ")")) << "\n";
  if (daemon.detach) {
    return Emit(
        JobDocument(*job), kExitOk, flags, flags.result_file,
        [](const Json& doc, std::ostream& o) { o << doc["job_id"].get<std::string>() << "\n"; },
        out, err);
  }
  return FollowJob(**client, *job, flags, stop, out, err);
}

int RunStatus(const std::string& job_id, const DaemonFlags& daemon, const OutputFlags& flags,
              std::ostream& out, std::ostream& err) {
  auto client = ConnectTo(daemon);
  if (!client.ok()) return Fail(client.status(), flags, flags.result_file, out, err, true);
  auto job = (*client)->Get(job_id);
  if (!job.ok()) return Fail(job.status(), flags, flags.result_file, out, err);
  return Emit(JobDocument(*job), ExitCodeForJob(*job), flags, flags.result_file, PrintJob, out,
              err);
}

int RunList(const std::vector<std::string>& states, int limit, const DaemonFlags& daemon,
            const OutputFlags& flags, std::ostream& out, std::ostream& err) {
  std::vector<v1::JobState> filter;
  for (const std::string& name : states) {
    v1::JobState state;
    if (!v1::JobState_Parse(absl::StrCat("JOB_STATE_", absl::AsciiStrToUpper(name)), &state)) {
      return Fail(
          absl::InvalidArgumentError(absl::StrCat(
              "unknown state \"", name, "\"; use queued, running, succeeded, failed, cancelled")),
          flags, flags.result_file, out, err, true);
    }
    filter.push_back(state);
  }
  auto client = ConnectTo(daemon);
  if (!client.ok()) return Fail(client.status(), flags, flags.result_file, out, err, true);
  Json doc;
  doc["jobs"] = Json::array();
  std::string token;
  do {
    auto page = (*client)->List(filter, std::min(limit, 1000), token);
    if (!page.ok()) return Fail(page.status(), flags, flags.result_file, out, err);
    for (const v1::Job& job : page->jobs()) {
      if (static_cast<int>(doc["jobs"].size()) >= limit) break;
      doc["jobs"].push_back(JobDocument(job));
    }
    token = page->next_page_token();
  } while (!token.empty() && static_cast<int>(doc["jobs"].size()) < limit);
  return Emit(
      std::move(doc), kExitOk, flags, flags.result_file,
      [](const Json& d, std::ostream& o) {
        for (const Json& job : d["jobs"]) {
          o << absl::StrFormat("%-20s %-10s %-12s %s -> %s\n", job["job_id"].get<std::string>(),
                               job["state"].get<std::string>(),
                               job["job"]["spec"]["kind"].get<std::string>().substr(9),
                               job["job"]["spec"]["input"].get<std::string>(),
                               job["job"]["spec"]["output"].get<std::string>());
        }
      },
      out, err);
}

int RunWatch(const std::string& job_id, const DaemonFlags& daemon, const OutputFlags& flags,
             const std::atomic<bool>* stop, std::ostream& out, std::ostream& err) {
  auto client = ConnectTo(daemon);
  if (!client.ok()) return Fail(client.status(), flags, flags.result_file, out, err, true);
  auto job = (*client)->Get(job_id);
  if (!job.ok()) return Fail(job.status(), flags, flags.result_file, out, err);
  return FollowJob(**client, *job, flags, stop, out, err);
}

int RunCancel(const std::string& job_id, const DaemonFlags& daemon, const OutputFlags& flags,
              std::ostream& out, std::ostream& err) {
  auto client = ConnectTo(daemon);
  if (!client.ok()) return Fail(client.status(), flags, flags.result_file, out, err, true);
  auto job = (*client)->Cancel(job_id);
  if (!job.ok()) return Fail(job.status(), flags, flags.result_file, out, err);
  return Emit(JobDocument(*job), kExitOk, flags, flags.result_file, PrintJob, out, err);
}

}  // namespace reshard
