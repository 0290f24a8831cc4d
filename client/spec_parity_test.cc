// The same conversion request given three ways must reach the engine as the same
// ConversionSpec: reshardctl's flags run in-process, the JobSpec reshardctl submits to reshardd,
// and the JobSpec the Python client (clients/python) submits, both as the daemon reads them.

#include <stdio.h>

#include <filesystem>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "lib/engine/spec_codec.h"
#include "gtest/gtest.h"
#include "lib/testing/test_files.h"
#include "proto/reshard/v1/job_spec_codec.h"
#include "proto/reshard/v1/reshard.pb.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

constexpr char kRules[] = R"({"rules": [{"pattern": "w$", "split_dim": 0}, {"pattern": ".*", "replicate": true}]})";

std::string Runfile(const std::string& path) {
  const char* srcdir = ::getenv("TEST_SRCDIR");
  const char* workspace = ::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/",
                      workspace != nullptr ? workspace : "reshard", "/", path);
}

// The JobSpec the Python client submits for `call` (client/testing/python_job_spec.py), run in
// the current folder.
v1::JobSpec PythonJobSpec(const std::string& call) {
  const std::string command =
      absl::StrCat("PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=", Runfile("clients/python"),
                   " /usr/bin/python3 ", Runfile("client/testing/python_job_spec.py"), " '", call,
                   "'");
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string hex;
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return {};
  }
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) hex.append(buffer, n);
  EXPECT_EQ(::pclose(pipe), 0) << command;
  v1::JobSpec spec;
  EXPECT_TRUE(spec.ParseFromString(absl::HexStringToBytes(hex))) << hex;
  return spec;
}

// Every field of a ConversionSpec (SpecFields()), by name, as text.
std::map<std::string, std::string> Fields(const ConversionSpec& spec) {
  std::map<std::string, std::string> fields;
  for (const SpecField& field : SpecFields()) {
    fields[std::string(field.name)] = SpecFieldText(spec, field);
  }
  return fields;
}

class SpecParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("spec_parity");
    fs::create_directories(fs::path(dir_) / "ckpt");
    WriteAll(dir_ + "/rules.json", kRules);
    cwd_ = fs::current_path();
    // Relative paths, as a user types them, resolve against the same folder in every path.
    fs::current_path(dir_);
  }
  void TearDown() override { fs::current_path(cwd_); }

  // The request as reshardctl's flags (in-process and submitted) and as a Python call.
  void ExpectSameSpec(const ConversionFlags& flags, bool reshard, const DaemonFlags& daemon,
                      const std::string& python_call) {
    absl::StatusOr<ConversionSpec> local = ConversionSpecFromFlags(flags, reshard);
    ASSERT_TRUE(local.ok()) << local.status();
    absl::StatusOr<v1::JobSpec> submitted = JobSpecFromFlags(flags, reshard, daemon);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    absl::StatusOr<ConversionSpec> remote = ConversionSpecFromProto(*submitted);
    ASSERT_TRUE(remote.ok()) << remote.status();
    absl::StatusOr<ConversionSpec> python = ConversionSpecFromProto(PythonJobSpec(python_call));
    ASSERT_TRUE(python.ok()) << python.status();
    const std::pair<const char*, const ConversionSpec*> routes[] = {
        {"reshardctl in-process", &*local},
        {"reshardctl --server", &*remote},
        {"python client", &*python}};
    for (size_t a = 0; a < std::size(routes); ++a) {
      for (size_t b = a + 1; b < std::size(routes); ++b) {
        const std::map<std::string, std::string> want = Fields(*routes[a].second);
        const std::map<std::string, std::string> got = Fields(*routes[b].second);
        for (const auto& [name, value] : want) {
          EXPECT_EQ(got.at(name), value) << name << ": " << routes[a].first << " vs "
                                         << routes[b].first;
        }
      }
    }
    // The request the engine records (partitioned split, s3 plan id) is the same too.
    EXPECT_EQ(*ConversionRequestJson(*local), *ConversionRequestJson(*remote));
    EXPECT_EQ(*ConversionRequestJson(*local), *ConversionRequestJson(*python));
  }

  std::string dir_;
  fs::path cwd_;
};

TEST_F(SpecParityTest, Consolidate) {
  ConversionFlags flags;
  flags.input = "ckpt";
  flags.output = "out/";
  flags.dtype = "bf16";
  flags.max_shard_size = "1GB";
  ExpectSameSpec(flags, /*reshard=*/false, DaemonFlags(),
                 R"({"method": "consolidate", "args": ["ckpt", "out/"],
                     "kwargs": {"dtype": "bf16", "max_shard_size": "1GB"}})");
}

// The flags of `reshardctl reshard INPUT OUTPUT --parts PARTS`.
ConversionFlags ReshardFlags(std::string input, std::string output, int parts) {
  ConversionFlags flags;
  flags.input = std::move(input);
  flags.output = std::move(output);
  flags.parts = parts;
  return flags;
}

TEST_F(SpecParityTest, ReshardWithRulesFile) {
  ConversionFlags flags = ReshardFlags("ckpt", "tp2", 2);
  flags.rules = "rules.json";
  ExpectSameSpec(flags, /*reshard=*/true, DaemonFlags(),
                 R"({"method": "reshard", "args": ["ckpt", "tp2", 2, "rules.json"],
                     "kwargs": {}})");
}

TEST_F(SpecParityTest, EveryOption) {
  ConversionFlags flags;
  flags.input = "./ckpt/";
  flags.output = "sub/../tp4";
  flags.dtype = "fp16";
  flags.parts = 4;
  flags.pipeline_parts = 2;
  flags.expert_parts = 2;
  flags.update_latest = true;
  flags.rules = "rules.json";
  flags.threads = 3;
  flags.window_size = "8MiB";
  flags.duplicate_tied = true;
  flags.no_crc_check = true;
  flags.io = "buffered";
  flags.output_format = "megatron";
  flags.tag = "global_step5";
  flags.include_optimizer = true;
  flags.partition = "1/3";
  flags.overwrite = true;
  flags.no_extra_files = true;
  flags.tokenizer = "sub/../tok/";
  ExpectSameSpec(flags, /*reshard=*/true, DaemonFlags(),
                 R"({"method": "reshard", "args": ["./ckpt/", "sub/../tp4", 4, "rules.json"],
                     "kwargs": {"dtype": "fp16", "pipeline_parts": 2, "expert_parts": 2,
                                "update_latest": true,
                                "threads": 3, "window_bytes": "8MiB", "duplicate_tied": true,
                                "skip_crc_check": true, "io": "buffered",
                                "output_format": "megatron", "tag": "global_step5",
                                "include_optimizer": true, "overwrite": true,
                                "partition_index": 1, "partition_count": 3,
                                "no_extra_files": true, "tokenizer": "sub/../tok/"}})");
}

// A Hugging Face model imported into Megatron with --family and --config: the config file's
// path is made absolute against the caller's folder by every route.
TEST_F(SpecParityTest, ReshardImportWithFamilyAndConfig) {
  ConversionFlags flags = ReshardFlags("hf", "tp2", 2);
  flags.output_format = "megatron";
  flags.hf_family = "llama";
  flags.hf_config_file = "sub/../cfg/llama.json";
  ExpectSameSpec(flags, /*reshard=*/true, DaemonFlags(),
                 R"({"method": "reshard", "args": ["hf", "tp2", 2],
                     "kwargs": {"output_format": "megatron", "hf_family": "llama",
                                "hf_config_file": "sub/../cfg/llama.json"}})");
}

// Every field with a flag is an option of `consolidate` or `reshard` (reshardctl_main.cc
// registers them from the rows one by one).
TEST(SpecFlagsTest, EveryFlagIsAnOptionOfReshardctl) {
  std::string help;
  for (const char* command : {"consolidate", "reshard"}) {
    const std::string line = absl::StrCat(Runfile("client/reshardctl"), " ", command, " --help");
    FILE* pipe = ::popen(line.c_str(), "r");
    ASSERT_NE(pipe, nullptr) << line;
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) help.append(buffer, n);
    EXPECT_EQ(::pclose(pipe), 0) << line;
  }
  for (const SpecField& field : SpecFields()) {
    if (field.flag.empty()) continue;
    EXPECT_NE(help.find(absl::StrCat(" ", field.flag, " ")), std::string::npos)
        << field.flag << " (" << field.name << ") is not an option of reshardctl:\n"
        << help;
  }
}

}  // namespace
}  // namespace reshard
