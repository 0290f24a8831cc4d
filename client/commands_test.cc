#include "client/commands.h"

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/status/status.h"
#include "client/exit_codes.h"
#include "gtest/gtest.h"
#include "lib/formats/safetensors/safetensors_format.h"
#include "lib/testing/test_files.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

ConversionFlags Input(const std::string& path) {
  ConversionFlags flags;
  flags.input = path;
  return flags;
}

namespace fs = std::filesystem;
using Json = nlohmann::json;

// A small model: w F32 [4, 4] (values 0..15), b F32 [4], step I64 [].
std::string WriteModel(const std::string& path, float w_bias = 0) {
  std::vector<SafetensorsTensorEntry> entries = {
      {"step", DType::kI64, {}, 0, 8},
      {"b", DType::kF32, {4}, 8, 24},
      {"w", DType::kF32, {4, 4}, 24, 88},
  };
  auto header = EncodeSafetensorsHeader(entries, {{"format", "pt"}});
  EXPECT_TRUE(header.ok());
  std::string data;
  const int64_t step = 42;
  data.append(reinterpret_cast<const char*>(&step), 8);
  for (int i = 0; i < 4; ++i) {
    const float v = 0.5f * i;
    data.append(reinterpret_cast<const char*>(&v), 4);
  }
  for (int i = 0; i < 16; ++i) {
    const float v = static_cast<float>(i) + (i == 5 ? w_bias : 0);
    data.append(reinterpret_cast<const char*>(&v), 4);
  }
  WriteAll(path, *header + data);
  return *header + data;
}

Json ParseJson(const std::string& text) {
  Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(doc.is_discarded()) << "not one JSON document: " << text;
  return doc;
}

void ExpectFields(const Json& doc, const std::vector<std::string>& fields) {
  for (const std::string& field : fields) {
    EXPECT_TRUE(doc.contains(field)) << "missing \"" << field << "\" in " << doc.dump();
  }
}

OutputFlags JsonFlags() {
  OutputFlags flags;
  flags.json = true;
  flags.progress = false;
  return flags;
}

class CommandsTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir("cli");
    model_ = root_ + "/model.safetensors";
    WriteModel(model_);
  }
  std::string root_, model_;
  std::ostringstream out_, err_;
};

TEST_F(CommandsTest, InspectJson) {
  ASSERT_EQ(RunInspect(Input(model_), JsonFlags(), out_, err_), kExitOk) << err_.str();
  Json doc = ParseJson(out_.str());
  ExpectFields(doc,
               {"ok", "format", "layout", "parts", "files", "tensors", "total_bytes", "metadata"});
  EXPECT_EQ(doc["ok"], true);
  EXPECT_EQ(doc["format"], "safetensors");
  EXPECT_EQ(doc["layout"], "single-file");
  EXPECT_EQ(doc["parts"], 1);
  ASSERT_EQ(doc["files"].size(), 1u);
  ExpectFields(doc["files"][0], {"path", "bytes"});
  EXPECT_EQ(doc["files"][0]["bytes"].get<uint64_t>(), fs::file_size(model_));
  ASSERT_EQ(doc["tensors"].size(), 3u);
  for (const Json& tensor : doc["tensors"])
    ExpectFields(tensor, {"name", "dtype", "shape", "bytes"});
  EXPECT_EQ(doc["total_bytes"], 88);
  EXPECT_EQ(doc["metadata"]["format"], "pt");
  bool found_w = false;
  for (const Json& tensor : doc["tensors"]) {
    if (tensor["name"] == "w") {
      found_w = true;
      EXPECT_EQ(tensor["dtype"], "F32");
      EXPECT_EQ(tensor["shape"], Json::array({4, 4}));
      EXPECT_EQ(tensor["bytes"], 64);
    }
  }
  EXPECT_TRUE(found_w);
}

TEST_F(CommandsTest, InspectText) {
  OutputFlags flags;
  ASSERT_EQ(RunInspect(Input(model_), flags, out_, err_), kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("safetensors"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("w"), std::string::npos);
}

TEST_F(CommandsTest, MissingInputExits3) {
  const std::string missing = root_ + "/nope.safetensors";
  EXPECT_EQ(RunInspect(Input(missing), JsonFlags(), out_, err_), kExitInvalidInput);
  Json doc = ParseJson(out_.str());
  EXPECT_EQ(doc["ok"], false);
  EXPECT_EQ(doc["exit_code"], 3);
  EXPECT_EQ(doc["error"]["code"], "NOT_FOUND");
  EXPECT_NE(doc["error"]["message"].get<std::string>().find(missing), std::string::npos);
  EXPECT_NE(err_.str().find(missing), std::string::npos) << "error not on stderr";

  std::ostringstream out2, err2;
  ConversionFlags conversion;
  conversion.input = missing;
  conversion.output = root_ + "/out";
  EXPECT_EQ(RunConvert(conversion, false, JsonFlags(), nullptr, out2, err2), kExitInvalidInput);
  EXPECT_FALSE(fs::exists(root_ + "/out"));
}

TEST_F(CommandsTest, BadDTypeIsUsageError) {
  ConversionFlags conversion;
  conversion.input = model_;
  conversion.output = root_ + "/out";
  conversion.dtype = "fp8";
  EXPECT_EQ(RunConvert(conversion, false, JsonFlags(), nullptr, out_, err_), kExitUsage);
  Json doc = ParseJson(out_.str());
  EXPECT_EQ(doc["ok"], false);
  EXPECT_EQ(doc["exit_code"], 2);
  EXPECT_NE(doc["error"]["message"].get<std::string>().find("fp8"), std::string::npos);
  EXPECT_FALSE(fs::exists(root_ + "/out"));

  std::ostringstream out2, err2;
  conversion.dtype = "keep";
  conversion.max_shard_size = "5XB";
  EXPECT_EQ(RunPlan(conversion, JsonFlags(), out2, err2), kExitUsage);
  // reshard without --parts is a usage error too.
  std::ostringstream out3, err3;
  conversion.max_shard_size = "5GB";
  EXPECT_EQ(RunConvert(conversion, true, JsonFlags(), nullptr, out3, err3), kExitUsage);
  // Without --rules, an input whose format has no rules of its own is refused, naming --rules.
  std::ostringstream out4, err4;
  conversion.parts = 2;
  EXPECT_EQ(RunConvert(conversion, true, JsonFlags(), nullptr, out4, err4), kExitInvalidInput);
  EXPECT_NE(ParseJson(out4.str())["error"]["message"].get<std::string>().find("--rules"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(root_ + "/out"));
}

TEST_F(CommandsTest, PlanJson) {
  ConversionFlags conversion;
  conversion.input = model_;
  conversion.max_shard_size = "40";
  ASSERT_EQ(RunPlan(conversion, JsonFlags(), out_, err_), kExitOk) << err_.str();
  Json doc = ParseJson(out_.str());
  ExpectFields(doc, {"ok", "files", "total_bytes", "memory_bytes"});
  EXPECT_EQ(doc["ok"], true);
  // HF rule with 40 bytes: [w] (64 > 40, alone), [step, b] (8 + 16).
  uint64_t sum = 0;
  int data_files = 0;
  for (const Json& file : doc["files"]) {
    ExpectFields(file, {"name", "bytes", "tensors"});
    if (file["name"] != kSafetensorsIndexName) {
      sum += file["bytes"].get<uint64_t>();
      ++data_files;
    }
  }
  EXPECT_EQ(data_files, 2);
  EXPECT_EQ(doc["total_bytes"].get<uint64_t>(), sum);
  EXPECT_GT(doc["memory_bytes"].get<uint64_t>(), 0u);
  EXPECT_FALSE(fs::exists(root_ + "/out")) << "plan must not write";
}

// Beside model.safetensors, a Hugging Face folder's other files: listed by inspect, and
// planned as output files (tokenizer.json, larger than a companion file, as a data file).
TEST_F(CommandsTest, InspectAndPlanShowTheModelFilesCarried) {
  WriteAll(root_ + "/config.json", "{\"torch_dtype\": \"float32\"}");
  WriteAll(root_ + "/README.md", "# w\n");
  WriteAll(root_ + "/tokenizer.json", TestPattern(2 << 20));
  ASSERT_EQ(RunInspect(Input(model_), JsonFlags(), out_, err_), kExitOk) << err_.str();
  const Json doc = ParseJson(out_.str());
  ASSERT_TRUE(doc.contains("model_files")) << doc.dump();
  EXPECT_EQ(doc["model_files"],
            Json::parse(absl::StrCat(R"([{"path": ")", root_, R"(/README.md", "bytes": 4}, )",
                                     R"({"path": ")", root_, R"(/config.json", "bytes": 26}, )",
                                     R"({"path": ")", root_, R"(/tokenizer.json", "bytes": )",
                                     2 << 20, "}]")));
  std::ostringstream text, text_err;
  OutputFlags flags;
  ASSERT_EQ(RunInspect(Input(model_), flags, text, text_err), kExitOk) << text_err.str();
  EXPECT_NE(text.str().find("model files (carried into Hugging Face outputs"), std::string::npos)
      << text.str();

  std::ostringstream plan_out, plan_err;
  ConversionFlags conversion;
  conversion.input = model_;
  conversion.dtype = "bf16";
  ASSERT_EQ(RunPlan(conversion, JsonFlags(), plan_out, plan_err), kExitOk) << plan_err.str();
  std::map<std::string, uint64_t> planned;
  const Json plan = ParseJson(plan_out.str());
  for (const Json& file : plan["files"]) {
    planned[file["name"].get<std::string>()] = file["bytes"].get<uint64_t>();
  }
  EXPECT_EQ(planned.size(), 4u) << plan_out.str();
  EXPECT_EQ(planned["tokenizer.json"], 2u << 20);
  EXPECT_EQ(planned["README.md"], 4u);
  EXPECT_EQ(planned.count("config.json"), 1u);  // as cast: "bfloat16"
  EXPECT_EQ(planned.count("model.safetensors"), 1u);
}

TEST_F(CommandsTest, ConvertJsonAndRefusesNonEmptyOutput) {
  ConversionFlags conversion;
  conversion.input = model_;
  conversion.output = root_ + "/out";
  ASSERT_EQ(RunConvert(conversion, false, JsonFlags(), nullptr, out_, err_), kExitOk) << err_.str();
  Json doc = ParseJson(out_.str());
  ExpectFields(doc, {"ok", "output", "files", "tensors", "bytes_read", "bytes_written", "seconds",
                     "direct_io_files", "buffered_io_files", "reused_files", "reused_bytes",
                     "verification_failures"});
  EXPECT_EQ(doc["ok"], true);
  EXPECT_EQ(doc["reused_files"], 0);
  EXPECT_EQ(doc["tensors"], 3);
  // The default --io auto writes the data file with direct I/O (the test folder is on ext4).
  EXPECT_EQ(doc["direct_io_files"], 1);
  EXPECT_EQ(doc["buffered_io_files"], 0);
  EXPECT_TRUE(fs::exists(root_ + "/out/model.safetensors"));
  uint64_t total = 0;
  for (const Json& file : doc["files"]) {
    ExpectFields(file, {"name", "bytes", "tensors", "xxh3_64"});
    EXPECT_EQ(file["bytes"].get<uint64_t>(),
              fs::file_size(root_ + "/out/" + file["name"].get<std::string>()));
    total += file["bytes"].get<uint64_t>();
  }
  // `files` lists the data (and index) files; bytes_written also counts the manifest.
  for (const Json& file : doc["files"]) EXPECT_NE(file["name"], "reshard-manifest.json");
  EXPECT_EQ(doc["bytes_written"].get<uint64_t>(),
            total + fs::file_size(root_ + "/out/reshard-manifest.json"));

  // The same output again: not empty -> 3, and stdout is still one JSON document.
  std::ostringstream out2, err2;
  EXPECT_EQ(RunConvert(conversion, false, JsonFlags(), nullptr, out2, err2), kExitInvalidInput);
  Json again = ParseJson(out2.str());
  EXPECT_EQ(again["error"]["code"], "FAILED_PRECONDITION");
}

TEST_F(CommandsTest, ConvertCancelledExits5) {
  ConversionFlags conversion;
  conversion.input = model_;
  conversion.output = root_ + "/cancelled";
  std::atomic<bool> cancelled{true};
  EXPECT_EQ(RunConvert(conversion, false, JsonFlags(), &cancelled, out_, err_), kExitCancelled);
  EXPECT_FALSE(fs::exists(root_ + "/cancelled"));
}

TEST_F(CommandsTest, VerifyEqualAndDifferent) {
  const std::string same = root_ + "/same.safetensors";
  WriteModel(same);
  ASSERT_EQ(RunVerify(model_, same, {}, JsonFlags(), nullptr, out_, err_), kExitOk) << err_.str();
  Json doc = ParseJson(out_.str());
  ExpectFields(doc, {"ok", "equal", "tensors_compared", "mismatched", "only_in_a", "only_in_b",
                     "tolerance"});
  EXPECT_EQ(doc["equal"], true);
  EXPECT_EQ(doc["tensors_compared"], 3);

  const std::string different = root_ + "/different.safetensors";
  WriteModel(different, /*w_bias=*/0.25f);
  std::ostringstream out2, err2;
  EXPECT_EQ(RunVerify(model_, different, {}, JsonFlags(), nullptr, out2, err2), kExitVerifyFailed);
  Json diff = ParseJson(out2.str());
  EXPECT_EQ(diff["equal"], false);
  ASSERT_EQ(diff["mismatched"].size(), 1u);
  ExpectFields(diff["mismatched"][0], {"name", "mismatches", "first_index"});
  EXPECT_EQ(diff["mismatched"][0]["name"], "w");
  EXPECT_EQ(diff["mismatched"][0]["first_index"], 5);
  EXPECT_EQ(diff["mismatched"][0]["mismatches"], 1);

  // Text mode gives the same exit code.
  std::ostringstream out3, err3;
  OutputFlags text;
  EXPECT_EQ(RunVerify(model_, different, {}, text, nullptr, out3, err3), kExitVerifyFailed);
  EXPECT_NE(out3.str().find("DIFFERENT"), std::string::npos) << out3.str();
}

TEST(ExitCodesTest, EveryStatusCodeFamily) {
  EXPECT_EQ(ExitCodeForStatus(absl::OkStatus()), kExitOk);
  for (const absl::Status& status :
       {absl::InvalidArgumentError("x"), absl::NotFoundError("x"), absl::DataLossError("x"),
        absl::FailedPreconditionError("x"), absl::UnimplementedError("x"),
        absl::OutOfRangeError("x"), absl::AlreadyExistsError("x"), absl::PermissionDeniedError("x"),
        absl::UnauthenticatedError("x")}) {
    EXPECT_EQ(ExitCodeForStatus(status), kExitInvalidInput) << status;
  }
  EXPECT_EQ(ExitCodeForStatus(absl::CancelledError("x")), kExitCancelled);
  EXPECT_EQ(ExitCodeForStatus(absl::ResourceExhaustedError("x")), kExitResourceExhausted);
  EXPECT_EQ(ExitCodeForStatus(absl::UnavailableError("x")), kExitUnavailable);
  EXPECT_EQ(ExitCodeForStatus(absl::DeadlineExceededError("x")), kExitUnavailable);
  for (const absl::Status& status :
       {absl::InternalError("x"), absl::UnknownError("x"), absl::AbortedError("x")}) {
    EXPECT_EQ(ExitCodeForStatus(status), kExitInternal) << status;
  }
  // The documented numbers never change.
  EXPECT_EQ(kExitOk, 0);
  EXPECT_EQ(kExitInternal, 1);
  EXPECT_EQ(kExitUsage, 2);
  EXPECT_EQ(kExitInvalidInput, 3);
  EXPECT_EQ(kExitVerifyFailed, 4);
  EXPECT_EQ(kExitCancelled, 5);
  EXPECT_EQ(kExitResourceExhausted, 6);
  EXPECT_EQ(kExitUnavailable, 7);
}

}  // namespace
}  // namespace reshard
