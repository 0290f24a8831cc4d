// reshardctl: inspect, plan, consolidate, reshard and verify model checkpoints, in-process
// or through reshardd (`--server ADDR` or RESHARD_SERVER), and follow reshardd's jobs.
//
//   bazel build //client:reshardctl
//   bazel-bin/client/reshardctl consolidate ckpt/ out/ --dtype bf16 --max-shard-size 5GB
//   bazel-bin/client/reshardctl --server 127.0.0.1:7070 consolidate /data/ckpt /data/out
//
// This file only parses the command line; the commands live in client/commands.cc.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <variant>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/commands.h"
#include "client/exit_codes.h"
#include "lib/core/version.h"
#include "lib/engine/spec_codec.h"
#include "lib/formats/format.h"

namespace {

std::atomic<bool> cancel_requested{false};

void OnSignal(int) { cancel_requested.store(true); }

// Registers the option of ConversionSpec field `name` (lib/engine/spec_codec.h): its flag and
// help text from the field's row, bound to the row's member of `flags`.
CLI::Option* AddSpecOption(CLI::App* command, reshard::ConversionFlags& flags,
                           absl::string_view name) {
  using reshard::ConversionFlags;
  const reshard::SpecField& field = reshard::SpecFieldNamed(name);
  const std::string flag(field.flag);
  const std::string help = reshard::SpecFieldHelp(field);
  return std::visit(
      reshard::Overloaded{
          [&](std::string ConversionFlags::*text) {
            return command->add_option(flag, flags.*text, help);
          },
          [&](int ConversionFlags::*number) {
            return command->add_option(flag, flags.*number, help);
          },
          [&](bool ConversionFlags::*set) { return command->add_flag(flag, flags.*set, help); },
          [&](std::monostate) -> CLI::Option* {
            std::cerr << "reshardctl: field " << name << " has no flag\n";
            std::abort();
          }},
      field.flag_value);
}

void InstallSignalHandlers() {
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace reshard;
  CLI::App app{absl::StrCat(
      "reshardctl: convert and reshard large-model training checkpoints\n  reads:  ",
      absl::StrJoin(InputFormatIds(), ", "), "\n  writes: ", absl::StrJoin(OutputFormatIds(), ", "),
      "\n  (files, folders or s3:// URLs; docs/cli.md)")};
  app.require_subcommand(1);
  app.set_version_flag("--version", absl::StrCat("reshardctl ", kReshardVersion));

  OutputFlags output;
  bool no_progress = false;
  ConversionFlags conversion;
  DaemonFlags daemon;
  std::string a, b, job_id;
  std::vector<std::string> states;
  int limit = 100;
  const std::pair<const char*, std::string*> defaults[] = {{"RESHARD_SERVER", &daemon.server},
                                                           {"RESHARD_TLS_CA", &daemon.tls_ca},
                                                           {"RESHARD_TLS_CERT", &daemon.tls_cert},
                                                           {"RESHARD_TLS_KEY", &daemon.tls_key},
                                                           {"RESHARD_TOKEN", &daemon.token}};
  for (const auto& [variable, value] : defaults) {
    if (const char* set = std::getenv(variable)) *value = set;
  }

  auto add_output = [&](CLI::App* command) {
    command->add_flag("--json", output.json, "print one JSON document on stdout");
    command->add_option("--result-file", output.result_file,
                        "also write the JSON document here (always, also on failure)");
  };
  auto add_server = [&](CLI::App* command) {
    command->add_option("--server", daemon.server, "reshardd address (default: $RESHARD_SERVER)");
    command->add_option("--tls-ca", daemon.tls_ca,
                        "connect with TLS: PEM CA certificates of the daemon (default: "
                        "$RESHARD_TLS_CA)");
    command->add_option("--tls-cert", daemon.tls_cert,
                        "PEM client certificate for mutual TLS (default: $RESHARD_TLS_CERT)");
    command->add_option("--tls-key", daemon.tls_key,
                        "PEM private key of --tls-cert (default: $RESHARD_TLS_KEY)");
    command->add_option("--token-file", daemon.token_file,
                        "file whose first line is the bearer token (default: the token in "
                        "$RESHARD_TOKEN)");
  };
  auto add_job_options = [&](CLI::App* command) {
    add_server(command);
    command->add_flag("--detach", daemon.detach, "submit and print the job id without waiting");
    command->add_option("--idempotency-key", daemon.idempotency_key,
                        "resubmitting with the same key re-attaches to the job (default: from "
                        "SLURM_ARRAY_JOB_ID/SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX)");
    command->add_option("--priority", daemon.priority, "higher runs first (-100..100)");
    command->add_option("--memory-budget", daemon.memory_budget, "memory the job may use");
    AddSpecOption(command, conversion, "overwrite");
    AddSpecOption(command, conversion, "partition_index");
  };
  auto add_read_options = [&](CLI::App* command) {
    AddSpecOption(command, conversion, "tag");
    AddSpecOption(command, conversion, "include_optimizer");
  };
  auto add_conversion = [&](CLI::App* command, bool with_output_dir) {
    command->add_option("IN", conversion.input, std::string(SpecFieldNamed("input").help))
        ->required();
    if (with_output_dir) {
      command->add_option("OUT", conversion.output, std::string(SpecFieldNamed("output").help))
          ->required();
    }
    AddSpecOption(command, conversion, "dtype")->capture_default_str();
    AddSpecOption(command, conversion, "rules_file");
    AddSpecOption(command, conversion, "threads")->capture_default_str();
    AddSpecOption(command, conversion, "window_bytes")->capture_default_str();
    AddSpecOption(command, conversion, "duplicate_tied");
    AddSpecOption(command, conversion, "skip_crc_check");
    AddSpecOption(command, conversion, "io")
        ->check(CLI::IsMember({"auto", "direct", "buffered"}))
        ->capture_default_str();
    AddSpecOption(command, conversion, "hf_family");
    AddSpecOption(command, conversion, "hf_config_file");
    AddSpecOption(command, conversion, "hf_vocab_size");
    AddSpecOption(command, conversion, "output_format")
        ->check(CLI::IsMember(OutputFormatIds()))
        ->capture_default_str();
    AddSpecOption(command, conversion, "update_latest");
    AddSpecOption(command, conversion, "no_extra_files");
    AddSpecOption(command, conversion, "tokenizer");
    add_read_options(command);
    add_output(command);
  };

  add_server(&app);  // also accepted before the command: reshardctl --server ADDR consolidate ...

  CLI::App* inspect = app.add_subcommand("inspect", "describe a checkpoint");
  inspect->add_option("IN", conversion.input, "input file, folder or s3:// URL")->required();
  AddSpecOption(inspect, conversion, "rules_file");
  add_read_options(inspect);
  add_output(inspect);
  add_server(inspect);

  CLI::App* plan = app.add_subcommand("plan", "dry run: output files, bytes, memory needed");
  add_conversion(plan, /*with_output_dir=*/false);
  AddSpecOption(plan, conversion, "max_shard_size")->capture_default_str();
  AddSpecOption(plan, conversion, "parts")->description("plan a reshard into M parts");
  AddSpecOption(plan, conversion, "pipeline_parts");
  AddSpecOption(plan, conversion, "expert_parts");
  plan->add_option("--partitions", conversion.partitions,
                   "also show the files each of K partitions writes (--partition I/K)");
  add_server(plan);

  CLI::App* consolidate =
      app.add_subcommand("consolidate", "merge a checkpoint into one model in --format");
  add_conversion(consolidate, /*with_output_dir=*/true);
  AddSpecOption(consolidate, conversion, "max_shard_size")->capture_default_str();
  consolidate->add_flag("--no-progress", no_progress, "do not show progress");
  add_job_options(consolidate);

  CLI::App* reshard = app.add_subcommand("reshard", "split or merge tensor-parallel parts, in --format");
  add_conversion(reshard, /*with_output_dir=*/true);
  AddSpecOption(reshard, conversion, "parts")->required();
  AddSpecOption(reshard, conversion, "pipeline_parts");
  AddSpecOption(reshard, conversion, "expert_parts");
  reshard->add_flag("--no-progress", no_progress, "do not show progress");
  add_job_options(reshard);

  CLI::App* commit = app.add_subcommand(
      "commit", "check every partition's record of a partitioned conversion and publish OUT");
  commit->add_option("OUT", conversion.output, "the output folder of the conversion")->required();
  add_output(commit);

  CLI::App* verify = app.add_subcommand("verify", "compare two checkpoints element by element");
  verify->add_option("A", a, "first checkpoint")->required();
  verify->add_option("B", b, "second checkpoint")->required();
  AddSpecOption(verify, conversion, "rules_file");
  add_read_options(verify);
  add_output(verify);

  CLI::App* status = app.add_subcommand("status", "show a reshardd job");
  status->add_option("JOB", job_id, "job id")->required();
  CLI::App* list = app.add_subcommand("list", "list reshardd jobs, newest first");
  list->add_option("--state", states, "only jobs in this state (repeatable)");
  list->add_option("--limit", limit, "at most this many jobs")->capture_default_str();
  CLI::App* watch = app.add_subcommand("watch", "follow a reshardd job until it ends");
  watch->add_option("JOB", job_id, "job id")->required();
  watch->add_flag("--no-progress", no_progress, "do not show progress");
  CLI::App* cancel = app.add_subcommand("cancel", "cancel a reshardd job");
  cancel->add_option("JOB", job_id, "job id")->required();
  for (CLI::App* command : {status, list, watch, cancel}) {
    add_output(command);
    add_server(command);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }

  InstallSignalHandlers();
  output.progress = !no_progress;
  output.terminal = isatty(STDERR_FILENO) != 0;
  std::ostream& out = std::cout;
  std::ostream& err = std::cerr;
  const bool remote = !daemon.server.empty();
  if (*inspect) {
    return remote ? RunRemoteInspect(conversion, daemon, output, out, err)
                  : RunInspect(conversion, output, out, err);
  }
  if (*plan) {
    return remote ? RunRemotePlan(conversion, daemon, output, out, err)
                  : RunPlan(conversion, output, out, err);
  }
  if (*consolidate || *reshard) {
    const bool is_reshard = static_cast<bool>(*reshard);
    return remote ? RunRemoteConvert(conversion, is_reshard, daemon, output, &cancel_requested, out,
                                     err)
                  : RunConvert(conversion, is_reshard, output, &cancel_requested, out, err);
  }
  if (*commit) return RunCommit(conversion.output, output, out, err);
  if (*verify) return RunVerify(a, b, conversion, output, &cancel_requested, out, err);
  if (!remote) {
    std::cerr
        << "reshardctl: this command needs a daemon: pass --server ADDR or set RESHARD_SERVER\n";
    return kExitUsage;
  }
  if (*status) return RunStatus(job_id, daemon, output, out, err);
  if (*list) return RunList(states, limit, daemon, output, out, err);
  if (*watch) return RunWatch(job_id, daemon, output, &cancel_requested, out, err);
  if (*cancel) return RunCancel(job_id, daemon, output, out, err);
  return kExitUsage;
}
