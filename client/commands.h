// reshardctl's commands, as functions of their parsed flags that write to the given streams
// and return the process exit code. main() only parses the command line and calls these.
// Without a daemon address the engine runs in-process; with one (`--server` or
// RESHARD_SERVER) the work goes to reshardd.

#ifndef RESHARD_CLIENT_COMMANDS_H_
#define RESHARD_CLIENT_COMMANDS_H_

#include <atomic>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/reports.h"
#include "lib/engine/conversion.h"
#include "lib/engine/spec_codec.h"
#include "proto/reshard/v1/reshard.pb.h"

namespace reshard {

// Options of commands that go through reshardd.
struct DaemonFlags {
  std::string server;  // "host:port"
  // TLS files (ClientOptions); defaults from RESHARD_TLS_CA, RESHARD_TLS_CERT, RESHARD_TLS_KEY.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  // A file holding the bearer token (first line); else the token from RESHARD_TOKEN.
  std::string token_file;
  std::string token;
  bool detach = false;          // submit and return the job id without waiting
  std::string idempotency_key;  // empty: derived from the Slurm / Kubernetes environment
  int priority = 0;
  std::string memory_budget;  // empty: what the plan needs
};

// The ConversionSpec `consolidate` (reshard == false) or `reshard` runs in-process:
// ParseConversionFlags, NormalizeSpec and ValidateSpec (spec_codec.h). `usage`, when given, is
// set when a flag holds a value the option does not take (exit 2); a flag the job does not
// read is refused with a status that IsUsageError.
absl::StatusOr<ConversionSpec> ConversionSpecFromFlags(const ConversionFlags& flags, bool reshard,
                                                       bool* usage = nullptr);

// The JobSpec the same command sends to reshardd: the same ConversionSpec
// (JobSpecFromConversionSpec), plus the job's priority and memory budget.
absl::StatusOr<v1::JobSpec> JobSpecFromFlags(const ConversionFlags& flags, bool reshard,
                                             const DaemonFlags& daemon, bool* usage = nullptr);

// `conversion` supplies the input, rules and read options (tag, optimizer) only.
int RunInspect(const ConversionFlags& conversion, const OutputFlags& flags, std::ostream& out,
               std::ostream& err);

// `plan`: the dry run. parts > 0 plans a reshard into that many parts, else a consolidation.
int RunPlan(const ConversionFlags& conversion, const OutputFlags& flags, std::ostream& out,
            std::ostream& err);

// `consolidate` (reshard == false) and `reshard`.
int RunConvert(const ConversionFlags& conversion, bool reshard, const OutputFlags& flags,
               const std::atomic<bool>* cancelled, std::ostream& out, std::ostream& err);

// `commit OUT`: re-checks the records of a partitioned conversion and publishes OUT.
int RunCommit(const std::string& output, const OutputFlags& flags, std::ostream& out,
              std::ostream& err);

int RunVerify(const std::string& a, const std::string& b, const ConversionFlags& read,
              const OutputFlags& flags, const std::atomic<bool>* cancelled, std::ostream& out,
              std::ostream& err);

// The same through reshardd. A signal while waiting stops waiting (exit 5) but leaves the job
// running, so that a requeued Slurm task re-attaches to it through its idempotency key.
int RunRemoteInspect(const ConversionFlags& conversion, const DaemonFlags& daemon,
                     const OutputFlags& flags, std::ostream& out, std::ostream& err);
int RunRemotePlan(const ConversionFlags& conversion, const DaemonFlags& daemon,
                  const OutputFlags& flags, std::ostream& out, std::ostream& err);
int RunRemoteConvert(const ConversionFlags& conversion, bool reshard, const DaemonFlags& daemon,
                     const OutputFlags& flags, const std::atomic<bool>* stop, std::ostream& out,
                     std::ostream& err);

// Job commands (daemon only).
int RunStatus(const std::string& job_id, const DaemonFlags& daemon, const OutputFlags& flags,
              std::ostream& out, std::ostream& err);
int RunList(const std::vector<std::string>& states, int limit, const DaemonFlags& daemon,
            const OutputFlags& flags, std::ostream& out, std::ostream& err);
int RunWatch(const std::string& job_id, const DaemonFlags& daemon, const OutputFlags& flags,
             const std::atomic<bool>* stop, std::ostream& out, std::ostream& err);
int RunCancel(const std::string& job_id, const DaemonFlags& daemon, const OutputFlags& flags,
              std::ostream& out, std::ostream& err);

// The idempotency key used when none is given: "slurm-<array job>-<task>:<spec hash>" or
// "k8s-<completion index>-<hostname>:<spec hash>" from the environment, else empty. The spec
// hash keeps two different conversions of one task from colliding.
std::string DefaultIdempotencyKey(const std::string& spec_fingerprint);

}  // namespace reshard

#endif  // RESHARD_CLIENT_COMMANDS_H_
