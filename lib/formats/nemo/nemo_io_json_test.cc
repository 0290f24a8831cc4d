#include "lib/formats/nemo/nemo_io_json.h"

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

// A TrainerContext(model=LlamaModel(config=LlamaConfig(...))) as fiddle's dump_json writes it
// (tests/fixtures/nemo_io_json_fixture.py has the general writer): configs in "objects",
// arguments as leaves, metadata with the argument names.
std::string Metadata(const std::string& module, const std::string& name,
                     const std::string& names_key) {
  return absl::StrCat(
      R"j({"type": {"type": "pyref", "module": "fiddle._src.config", "name": "BuildableTraverserMetadata"},
          "items": [["Attr(name='fn_or_cls')", {"type": "pyref", "module": ")j",
      module, R"j(", "name": ")j", name, R"j("}],
                    ["Attr(name='argument_names')", {"type": "ref", "key": ")j",
      names_key,
      R"j("}], ["Attr(name='argument_tags')", {}], ["Attr(name='argument_history')", {}]]})j");
}

std::string Config(const std::string& items, const std::string& metadata) {
  return absl::StrCat(
      R"j({"type": {"type": "pyref", "module": "fiddle._src.config", "name": "Config"}, "items": )j",
      items, R"j(, "metadata": {"type": "ref", "key": ")j", metadata,
      R"j("}, "paths": ["<root>"]})j");
}

std::string Names(const std::string& names) {
  return absl::StrCat(
      R"j({"type": {"type": "pyref", "module": "builtins", "name": "tuple"}, "items": )j", names,
      R"j(, "metadata": null})j");
}

std::string IoJson(const std::string& config_items, const std::string& config_names) {
  return absl::StrCat(
      R"j({"root": {"type": "ref", "key": "trainer_context_1"}, "objects": {)j",
      R"j("llama_config_1": )j", Config(config_items, "m1"), ",", R"j("m1": )j",
      Metadata("nemo.collections.llm.gpt.model.llama", "LlamaConfig", "t1"), ",", R"j("t1": )j",
      Names(config_names), ",", R"j("llama_model_1": )j",
      Config(R"j([["Attr(name='config')", {"type": "ref", "key": "llama_config_1"}]])j", "m2"), ",",
      R"j("m2": )j", Metadata("nemo.collections.llm.gpt.model.llama", "LlamaModel", "t2"), ",",
      R"j("t2": )j", Names(R"j([["Index(index=0)", "config"]])j"), ",",
      R"j("trainer_context_1": )j",
      Config(R"j([["Attr(name='model')", {"type": "ref", "key": "llama_model_1"}]])j", "m3"), ",",
      R"j("m3": )j", Metadata("nemo.lightning.io.pl", "TrainerContext", "t3"), ",", R"j("t3": )j",
      Names(R"j([["Index(index=0)", "model"]])j"), R"j(}, "refcounts": {}, "version": "0.0.1"})j");
}

constexpr char kItems[] = R"j([
  ["Attr(name='num_layers')", {"type": "leaf", "value": 2, "paths": ["<root>.model.config.num_layers"]}],
  ["Attr(name='layernorm_epsilon')", {"type": "leaf", "value": 1e-06}],
  ["Attr(name='gated_linear_unit')", {"type": "leaf", "value": true}],
  ["Attr(name='normalization')", {"type": "leaf", "value": "RMSNorm"}],
  ["Attr(name='vocab_size')", {"type": "leaf", "value": null}],
  ["Attr(name='activation_func')", {"type": "pyref", "module": "torch.nn.functional", "name": "silu"}],
  ["Attr(name='rotary_base')", 10000.0]])j";
constexpr char kNames[] =
    R"j([["Index(index=0)", "num_layers"], ["Index(index=1)", "layernorm_epsilon"],
  ["Index(index=2)", "gated_linear_unit"], ["Index(index=3)", "normalization"],
  ["Index(index=4)", "vocab_size"], ["Index(index=5)", "activation_func"],
  ["Index(index=6)", "rotary_base"]])j";

TEST(NemoIoJsonTest, ReadsTheModelConfigAsModelYamlHoldsIt) {
  absl::StatusOr<std::optional<YamlNode>> config =
      NemoIoJsonModelConfig(IoJson(kItems, kNames), "ctx/io.json");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->has_value());
  const YamlNode& map = **config;
  EXPECT_EQ(YamlString(map.Get("_target_")), "nemo.collections.llm.gpt.model.llama.LlamaConfig");
  EXPECT_EQ(YamlInt(map.Get("num_layers")), 2);
  EXPECT_EQ(YamlString(map.Get("layernorm_epsilon")), "1e-06");
  EXPECT_EQ(YamlBool(map.Get("gated_linear_unit")), true);
  EXPECT_EQ(YamlString(map.Get("normalization")), "RMSNorm");
  EXPECT_EQ(map.Get("vocab_size")->kind, YamlNode::Kind::kNull);
  EXPECT_EQ(YamlString(map.Get("activation_func")->Get("_target_")), "torch.nn.functional.silu");
  EXPECT_EQ(YamlString(map.Get("rotary_base")), "10000.0");
}

TEST(NemoIoJsonTest, NoModelConfigIsNoError) {
  absl::StatusOr<std::optional<YamlNode>> config = NemoIoJsonModelConfig(
      R"j({"root": {"type": "leaf", "value": 1}, "objects": {}})j", "io.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->has_value());
}

TEST(NemoIoJsonTest, BadDocumentsNameTheJsonPath) {
  struct Case {
    std::string text;
    absl::StatusCode code;
    std::string message;
  };
  const std::string good = IoJson(kItems, kNames);
  const Case cases[] = {
      {R"j({"root": )j", absl::StatusCode::kDataLoss, "io.json: not valid JSON at byte offset 9"},
      {"[1]", absl::StatusCode::kDataLoss,
       "io.json: not fiddle's serialization (a JSON object with \"root\" and an \"objects\" "
       "object)"},
      {absl::StrReplaceAll(good,
                           {{R"j("key": "llama_config_1")j", R"j("key": "llama_config_9")j"}}),
       absl::StatusCode::kDataLoss,
       "io.json: objects[\"llama_model_1\"].items[0][1]: a reference to \"llama_config_9\", "
       "which \"objects\" lacks"},
      {absl::StrReplaceAll(good,
                           {{R"j({"type": "leaf", "value": true})j", R"j({"type": "leaf"})j"}}),
       absl::StatusCode::kDataLoss,
       "io.json: objects[\"llama_config_1\"].items[2][1]: a leaf without a JSON primitive "
       "\"value\""},
      {absl::StrReplaceAll(good, {{R"j(["Index(index=6)", "rotary_base"])j", R"j("oops")j"}}),
       absl::StatusCode::kDataLoss,
       "io.json: objects[\"t1\"].items[6]: an item that is not a [path element, value] pair"},
      {IoJson(kItems, R"j([["Index(index=0)", "num_layers"]])j"), absl::StatusCode::kDataLoss,
       "io.json: objects[\"llama_config_1\"]: 7 items, but its metadata names 1 arguments"},
      {std::string(100, '[') + std::string(100, ']'), absl::StatusCode::kResourceExhausted,
       "io.json: arrays and objects nested more than 64 deep at byte offset 64"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text.substr(0, 60));
    absl::StatusOr<std::optional<YamlNode>> config = NemoIoJsonModelConfig(c.text, "io.json");
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), c.code);
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace reshard
