// reshardctl's commands that go through reshardd (see commands.h).

#include <unistd.h>
#include <xxhash.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/commands.h"
#include "client/exit_codes.h"
#include "client/progress_bar.h"
#include "client/reports.h"
#include "lib/core/status.h"
#include "lib/engine/partition_spec.h"
#include "lib/io/file_access.h"
#include "lib/io/io_mode.h"
#include "lib/plan/layout_builders.h"
#include "lib/plan/partition_rules.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

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

// Paths become absolute here; remote URLs (s3://bucket/key) stay as they are: the daemon checks
// them against its s3:// roots (and refuses other schemes by name, not as "/cwd/gs:/...").
std::string Absolute(const std::string& path) {
  if (path.empty() || IsRemotePath(path)) return path;
  std::error_code error;
  fs::path absolute = fs::absolute(path, error);
  return error ? path : absolute.lexically_normal().string();
}

absl::StatusOr<std::string> ReadRules(const std::string& path) {
  if (path.empty()) return std::string();
  std::ifstream in(path, std::ios::binary);
  // A preset name ("megatron") that is not a file here is sent as the preset's rules.
  if (!in && !PartitionRulePreset(path).empty()) return PartitionRulePreset(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open partition rules file ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > (1u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition rules file ", path, " is larger than 1 MiB"));
  }
  return text.str();
}

// The job spec of a conversion command. Paths become absolute on this machine; the rules file
// is read here and sent inline.
absl::StatusOr<v1::JobSpec> BuildJobSpec(const ConversionFlags& conversion, bool reshard,
                                         const DaemonFlags& daemon) {
  v1::JobSpec spec;
  spec.set_kind(reshard ? v1::JOB_KIND_RESHARD : v1::JOB_KIND_CONSOLIDATE);
  spec.set_input(Absolute(conversion.input));
  spec.set_output(Absolute(conversion.output));
  ASSIGN_OR_RETURN(DTypePolicy dtype, ParseDTypePolicy(conversion.dtype));
  switch (dtype) {
    case DTypePolicy::kF32:
      spec.set_dtype(v1::DTYPE_FP32);
      break;
    case DTypePolicy::kBF16:
      spec.set_dtype(v1::DTYPE_BF16);
      break;
    case DTypePolicy::kF16:
      spec.set_dtype(v1::DTYPE_FP16);
      break;
    case DTypePolicy::kKeep:
      spec.set_dtype(v1::DTYPE_KEEP);
      break;
  }
  if (!reshard) {
    ASSIGN_OR_RETURN(uint64_t shard, ParseByteSize(conversion.max_shard_size));
    spec.set_max_shard_size(shard);
  } else {
    if (conversion.parts < 1) return absl::InvalidArgumentError("reshard needs --parts M (M >= 1)");
    spec.set_parts(conversion.parts);
    spec.set_pipeline_parts(conversion.pipeline_parts);
  }
  spec.set_update_latest(conversion.update_latest);
  ASSIGN_OR_RETURN(*spec.mutable_rules_json(), ReadRules(conversion.rules));
  if (!daemon.memory_budget.empty()) {
    ASSIGN_OR_RETURN(uint64_t budget, ParseByteSize(daemon.memory_budget));
    spec.set_memory_budget(budget);
  }
  spec.set_threads(conversion.threads);
  spec.set_duplicate_tied(conversion.duplicate_tied);
  spec.set_skip_crc_check(conversion.no_crc_check);
  RETURN_IF_ERROR(ParseIoMode(conversion.io).status());
  spec.set_io(conversion.io);
  spec.set_output_format(conversion.output_format);
  spec.set_tag(conversion.tag);
  spec.set_include_optimizer(conversion.include_optimizer);
  ASSIGN_OR_RETURN(uint64_t window, ParseByteSize(conversion.window_size));
  spec.set_window_bytes(window);
  spec.set_priority(daemon.priority);
  spec.set_overwrite(daemon.overwrite);
  if (!conversion.partition.empty()) {
    ASSIGN_OR_RETURN(const PartitionId partition, ParsePartition(conversion.partition));
    spec.set_partition_index(partition.index);
    spec.set_partition_count(partition.count);
  }
  return spec;
}

int ExitCodeForJob(const v1::Job& job) {
  switch (job.state()) {
    case v1::JOB_STATE_SUCCEEDED:
      return kExitOk;
    case v1::JOB_STATE_CANCELLED:
      return kExitCancelled;
    case v1::JOB_STATE_FAILED:
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
  const std::string& input = conversion.input;
  auto rules_json = ReadRules(conversion.rules);
  if (!rules_json.ok()) return Fail(rules_json.status(), flags, flags.result_file, out, err);
  auto client = ConnectTo(daemon);
  if (!client.ok()) return Fail(client.status(), flags, flags.result_file, out, err, true);
  auto response = (*client)->Inspect(Absolute(input), *rules_json, conversion.tag,
                                     conversion.include_optimizer);
  if (!response.ok()) return Fail(response.status(), flags, flags.result_file, out, err);
  return Emit(InspectDocument(Absolute(input), *response), kExitOk, flags, flags.result_file,
              PrintInspect, out, err);
}

int RunRemotePlan(const ConversionFlags& conversion, const DaemonFlags& daemon,
                  const OutputFlags& flags, std::ostream& out, std::ostream& err) {
  const bool reshard = conversion.parts > 0;
  ConversionFlags with_output = conversion;
  if (with_output.output.empty()) with_output.output = Absolute(conversion.input) + ".plan";
  auto spec = BuildJobSpec(with_output, reshard, daemon);
  if (!spec.ok()) return Fail(spec.status(), flags, flags.result_file, out, err, true);
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
  auto spec = BuildJobSpec(conversion, reshard, daemon);
  if (!spec.ok()) return Fail(spec.status(), flags, flags.result_file, out, err, true);
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
