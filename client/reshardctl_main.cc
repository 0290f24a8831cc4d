// reshardctl: inspect, plan, consolidate, reshard and verify model checkpoints.
//
//   bazel build //client:reshardctl
//   bazel-bin/client/reshardctl consolidate ckpt/ out/ --dtype bf16 --max-shard-size 5GB
//
// This file only parses the command line; the commands live in client/commands.cc.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iostream>

#include "CLI/CLI.hpp"
#include "client/commands.h"
#include "client/exit_codes.h"

namespace {

std::atomic<bool> cancel_requested{false};

void OnSignal(int) { cancel_requested.store(true); }

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
  CLI::App app{"reshardctl: convert and reshard large-model checkpoints (safetensors)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "reshardctl 0.1.0");

  OutputFlags output;
  bool no_progress = false;
  ConversionFlags conversion;
  std::string rules, a, b;

  auto add_output = [&](CLI::App* command) {
    command->add_flag("--json", output.json, "print one JSON document on stdout");
  };
  auto add_conversion = [&](CLI::App* command, bool with_output_dir) {
    command->add_option("IN", conversion.input, "input .safetensors file or folder")->required();
    if (with_output_dir) {
      command->add_option("OUT", conversion.output, "output folder (must not exist or be empty)")
          ->required();
    }
    command->add_option("--dtype", conversion.dtype, "keep | fp32 | bf16 | fp16 (floating tensors)")
        ->capture_default_str();
    command->add_option("--rules", conversion.rules, "partition rules JSON file");
    command->add_option("--threads", conversion.threads, "output files written in parallel")
        ->capture_default_str();
    command->add_option("--window-size", conversion.window_size, "buffer per thread")
        ->capture_default_str();
    add_output(command);
  };

  CLI::App* inspect = app.add_subcommand("inspect", "describe a checkpoint");
  inspect->add_option("IN", conversion.input, "input file or folder")->required();
  inspect->add_option("--rules", rules, "partition rules to merge model-parallel parts");
  add_output(inspect);

  CLI::App* plan = app.add_subcommand("plan", "dry run: output files, bytes, memory needed");
  add_conversion(plan, /*with_output_dir=*/false);
  plan->add_option("--max-shard-size", conversion.max_shard_size, "largest output file")
      ->capture_default_str();
  plan->add_option("--parts", conversion.parts, "plan a reshard into M parts");

  CLI::App* consolidate = app.add_subcommand("consolidate", "write one model (HF sharded safetensors)");
  add_conversion(consolidate, /*with_output_dir=*/true);
  consolidate->add_option("--max-shard-size", conversion.max_shard_size, "largest output file")
      ->capture_default_str();
  consolidate->add_flag("--no-progress", no_progress, "do not show progress");

  CLI::App* reshard = app.add_subcommand("reshard", "split or merge tensor-parallel parts");
  add_conversion(reshard, /*with_output_dir=*/true);
  reshard->add_option("--parts", conversion.parts, "number of output parts")->required();
  reshard->add_flag("--no-progress", no_progress, "do not show progress");

  CLI::App* verify = app.add_subcommand("verify", "compare two checkpoints element by element");
  verify->add_option("A", a, "first checkpoint")->required();
  verify->add_option("B", b, "second checkpoint")->required();
  verify->add_option("--rules", rules, "partition rules to merge model-parallel parts");
  add_output(verify);

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
  if (*inspect) return RunInspect(conversion.input, rules, output, std::cout, std::cerr);
  if (*plan) return RunPlan(conversion, output, std::cout, std::cerr);
  if (*consolidate) {
    return RunConvert(conversion, /*reshard=*/false, output, &cancel_requested, std::cout, std::cerr);
  }
  if (*reshard) {
    return RunConvert(conversion, /*reshard=*/true, output, &cancel_requested, std::cout, std::cerr);
  }
  if (*verify) return RunVerify(a, b, rules, output, &cancel_requested, std::cout, std::cerr);
  return kExitUsage;
}
