#include "lib/formats/deepspeed/universal_format.h"

#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/core/catalog.h"
#include "lib/formats/deepspeed/universal_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

constexpr char kTag[] = "global_step5_universal";

void Touch(const std::string& path) { WriteAll(path, ""); }

std::string ErrorOf(const absl::StatusOr<InputModel>& model) {
  return model.ok() ? "(ok)" : std::string(model.status().message());
}

// The bytes of `tensor` read straight from its file, without the engine: one dense piece.
std::string BytesOf(const Catalog& catalog, const CatalogTensor& tensor) {
  EXPECT_EQ(tensor.pieces.size(), 1u) << tensor.name;
  if (tensor.pieces.size() != 1) return "";
  const SourcePiece& piece = tensor.pieces[0];
  EXPECT_EQ(piece.strides, RowMajorStrides(tensor.shape)) << tensor.name;
  const std::string file = ReadAll(catalog.files.at(piece.file).path);
  return file.substr(piece.byte_offset, TensorBytes(tensor));
}

std::vector<std::string> Names(const Catalog& catalog) {
  std::vector<std::string> names;
  for (const CatalogTensor& tensor : catalog.tensors) names.push_back(tensor.name);
  return names;
}

bool HasEntry(const Catalog& catalog, const std::string& entry) {
  for (const std::string& e : catalog.other_entries) {
    if (e == entry) return true;
  }
  return false;
}

TEST(UniversalInputTest, Probe) {
  const UniversalInput input;
  EXPECT_EQ(input.id(), "deepspeed-universal");
  EXPECT_EQ(input.probe_priority(), 25);
  const std::string root = MakeTempDir("universal_probe");
  // zero/optimizer_state.pt alone, or a param folder with fp32.pt alone.
  fs::create_directories(root + "/a/zero");
  Touch(root + "/a/zero/optimizer_state.pt");
  EXPECT_TRUE(input.Probe(root + "/a").value());
  fs::create_directories(root + "/b/zero/embed.weight");
  Touch(root + "/b/zero/embed.weight/fp32.pt");
  EXPECT_TRUE(input.Probe(root + "/b").value());
  // A parent with latest_universal.
  fs::create_directories(root + "/save");
  EXPECT_FALSE(input.Probe(root + "/save").value());
  Touch(root + "/save/latest_universal");
  EXPECT_TRUE(input.Probe(root + "/save").value());
  // A ZeRO checkpoint, an empty zero/, files.
  fs::create_directories(root + "/zero_ckpt/zero/embed.weight");
  Touch(root + "/zero_ckpt/mp_rank_00_model_states.pt");
  Touch(root + "/zero_ckpt/zero_pp_rank_0_mp_rank_00_optim_states.pt");
  EXPECT_FALSE(input.Probe(root + "/zero_ckpt").value());
  EXPECT_FALSE(input.Probe(root + "/a/zero/optimizer_state.pt").value());
  EXPECT_FALSE(input.Probe(root + "/missing").value());
}

TEST(UniversalInputTest, ReadsZeroTwoFolderThroughLatestUniversal) {
  const std::string root = MakeTempDir("universal_zero2");
  const BuiltFixture fixture = WriteUniversalFolder(root, UniversalFolderOptions{});
  auto model = UniversalInput().Read(root, ReadOptions{});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->format, "deepspeed-universal");
  EXPECT_EQ(model->arrangement, "sharded");
  EXPECT_EQ(model->description,
            "DeepSpeed universal checkpoint global_step5_universal, 3 parameters "
            "(universal_checkpoint_version 0.2), 1 tensor from mp_rank_00_model_states.pt module");
  ASSERT_EQ(model->parts.size(), 1u);
  const Catalog& catalog = model->parts[0];
  EXPECT_EQ(catalog.format, "deepspeed-universal");
  ASSERT_TRUE(ValidateCatalog(catalog).ok()) << ValidateCatalog(catalog);
  // param_shapes order (not name order), then the buffer from `module`; the 16-bit copies in
  // `module` are not read.
  EXPECT_EQ(Names(catalog),
            (std::vector<std::string>{"embed.weight", "ln.weight", "head.bias", "steps"}));
  ASSERT_EQ(catalog.tensors.size(), fixture.expected.size());
  for (size_t i = 0; i < fixture.expected.size(); ++i) {
    const CatalogTensor& tensor = catalog.tensors[i];
    EXPECT_EQ(tensor.dtype, fixture.expected[i].dtype) << tensor.name;
    EXPECT_EQ(tensor.shape, fixture.expected[i].shape) << tensor.name;
    EXPECT_EQ(BytesOf(catalog, tensor), fixture.expected[i].bytes) << tensor.name;
  }
  const std::string dir = absl::StrCat(root, "/", kTag);
  EXPECT_EQ(catalog.files[catalog.tensors[0].pieces[0].file].path,
            dir + "/zero/embed.weight/fp32.pt");
  EXPECT_EQ(catalog.files[catalog.tensors[3].pieces[0].file].path,
            dir + "/mp_rank_00_model_states.pt");
  // Every storage record read is checksummed.
  for (const SourceFile& file : catalog.files) EXPECT_FALSE(file.checksummed.empty()) << file.path;
  EXPECT_TRUE(HasEntry(catalog, "embed.weight.cat_dim: 0"));
  EXPECT_TRUE(HasEntry(catalog, "head.bias.cat_dim: 0"));
  EXPECT_EQ(catalog.Find("embed.weight.exp_avg"), -1);
  // The same folder given directly, and through --tag.
  model = UniversalInput().Read(dir, ReadOptions{});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->parts[0].tensors.size(), 4u);
  ReadOptions options;
  options.tag = kTag;
  fs::remove(root + "/latest_universal");
  model = UniversalInput().Read(root, options);
  ASSERT_TRUE(model.ok()) << model.status();
}

TEST(UniversalInputTest, IncludeOptimizerAddsTheMomentsAfterEachParam) {
  const std::string root = MakeTempDir("universal_moments");
  WriteUniversalFolder(root, UniversalFolderOptions{});
  ReadOptions options;
  options.include_optimizer = true;
  auto model = UniversalInput().Read(root, options);
  ASSERT_TRUE(model.ok()) << model.status();
  const Catalog& catalog = model->parts[0];
  EXPECT_EQ(Names(catalog),
            (std::vector<std::string>{"embed.weight", "embed.weight.exp_avg",
                                      "embed.weight.exp_avg_sq", "ln.weight", "ln.weight.exp_avg",
                                      "ln.weight.exp_avg_sq", "head.bias", "head.bias.exp_avg",
                                      "head.bias.exp_avg_sq", "steps"}));
  for (const char* param : {"embed.weight", "ln.weight", "head.bias"}) {
    const CatalogTensor& avg = catalog.tensors[catalog.Find(absl::StrCat(param, ".exp_avg"))];
    const CatalogTensor& avg_sq = catalog.tensors[catalog.Find(absl::StrCat(param, ".exp_avg_sq"))];
    EXPECT_EQ(avg.shape, catalog.tensors[catalog.Find(param)].shape);
    EXPECT_EQ(BytesOf(catalog, avg), UniversalFixtureBytes(param, 100)) << param;
    EXPECT_EQ(BytesOf(catalog, avg_sq), UniversalFixtureBytes(param, 200)) << param;
    EXPECT_TRUE(HasEntry(catalog, absl::StrCat(param, ".step: 5"))) << param;
  }
}

TEST(UniversalInputTest, ZeroThreeBareTensorsTakeTheirShapesFromParamShapes) {
  const std::string root = MakeTempDir("universal_zero3");
  const BuiltFixture fixture = WriteUniversalFolder(root, UniversalFolderOptions::ZeroThree());
  ReadOptions read;
  read.include_optimizer = true;
  auto model = UniversalInput().Read(fixture.input, read);
  ASSERT_TRUE(model.ok()) << model.status();
  const Catalog& catalog = model->parts[0];
  ASSERT_TRUE(ValidateCatalog(catalog).ok()) << ValidateCatalog(catalog);
  // The empty ZeRO-3 placeholders of `module` are not tensors of the model.
  EXPECT_EQ(catalog.tensors.size(), 10u);
  EXPECT_EQ(catalog.tensors[0].shape, (Shape{4, 3}));
  EXPECT_EQ(catalog.tensors[1].shape, (Shape{4, 3}));  // exp_avg, reshaped like the param
  EXPECT_EQ(BytesOf(catalog, catalog.tensors[0]), UniversalFixtureBytes("embed.weight"));
  EXPECT_EQ(catalog.tensors[catalog.Find("head.bias")].shape, (Shape{1}));
  EXPECT_EQ(catalog.tensors.back().name, "steps");
  EXPECT_EQ(catalog.files[catalog.tensors.back().pieces[0].file].path,
            fixture.input + "/zero_pp_rank_0_mp_rank_00_model_states.pt");
  EXPECT_NE(model->description.find("(universal_checkpoint_version 0.2)"), std::string::npos);

  // Without model states, a bare tensor stays flat.
  for (int rank : {0, 1}) {
    fs::remove(absl::StrCat(fixture.input, "/zero_pp_rank_", rank, "_mp_rank_00_model_states.pt"));
  }
  model = UniversalInput().Read(fixture.input, ReadOptions{});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(Names(model->parts[0]),
            (std::vector<std::string>{"embed.weight", "head.bias", "ln.weight"}));  // by name
  EXPECT_EQ(model->parts[0].tensors[0].shape, (Shape{12}));
  EXPECT_EQ(model->description,
            "DeepSpeed universal checkpoint global_step5_universal, 3 parameters");
}

TEST(UniversalInputTest, BareTensorDisagreeingWithParamShapesRefused) {
  const std::string root = MakeTempDir("universal_zero3_bad");
  const BuiltFixture fixture = WriteUniversalFolder(root, UniversalFolderOptions::ZeroThree());
  const std::string file = fixture.input + "/zero/embed.weight/fp32.pt";
  WriteUniversalState(file, {{}, std::string(10 * 4, '\0'), /*bare=*/true});
  auto model = UniversalInput().Read(fixture.input, ReadOptions{});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ErrorOf(model).find(file + ": the bare tensor has 10 elements, but param_shapes"),
            std::string::npos)
      << ErrorOf(model);
  EXPECT_NE(ErrorOf(model).find("[4, 3] (12 elements)"), std::string::npos) << ErrorOf(model);
}

// A universal folder of the fixture, for the refusals below; returns the folder.
std::string Folder(const std::string& tag) {
  const std::string root = MakeTempDir(tag);
  WriteUniversalFolder(root, UniversalFolderOptions{});
  return absl::StrCat(root, "/", kTag);
}

absl::StatusOr<InputModel> ReadWithOptimizer(const std::string& path) {
  ReadOptions options;
  options.include_optimizer = true;
  return UniversalInput().Read(path, options);
}

TEST(UniversalInputTest, MalformedStateFilesRefusedNamingTheFile) {
  const std::string dir = Folder("universal_bad_state");
  const std::string file = dir + "/zero/ln.weight/fp32.pt";
  // A dict without 'param'.
  PickleWriter p;
  p.BeginDict(false);
  p.String("cat_dim");
  p.Int(0);
  p.EndDict();
  WriteAll(file, BuildTorchSave(p.Finish(), {}).bytes);
  auto model = UniversalInput().Read(dir, ReadOptions{});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ErrorOf(model).find(file + ": the dict has no 'param' entry"), std::string::npos)
      << ErrorOf(model);
  // 'param' that is not a tensor.
  PickleWriter q;
  q.BeginDict(false);
  q.String("param");
  q.Int(3);
  q.EndDict();
  WriteAll(file, BuildTorchSave(q.Finish(), {}).bytes);
  model = UniversalInput().Read(dir, ReadOptions{});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ErrorOf(model).find(file + ": 'param' is int, not a tensor"), std::string::npos)
      << ErrorOf(model);
  // Neither a dict nor a tensor.
  PickleWriter r;
  r.BeginList();
  r.EndList();
  WriteAll(file, BuildTorchSave(r.Finish(), {}).bytes);
  model = UniversalInput().Read(dir, ReadOptions{});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ErrorOf(model).find(file + ": holds list"), std::string::npos) << ErrorOf(model);
  // Not a torch.save archive at all.
  WriteAll(file, "garbage");
  model = UniversalInput().Read(dir, ReadOptions{});
  EXPECT_FALSE(model.ok());
  EXPECT_NE(ErrorOf(model).find(file), std::string::npos) << ErrorOf(model);
}

TEST(UniversalInputTest, MomentsMustMatchTheParam) {
  const std::string dir = Folder("universal_bad_moment");
  const std::string file = dir + "/zero/embed.weight/exp_avg_sq.pt";
  WriteUniversalState(file, {{3, 4}, UniversalFixtureBytes("embed.weight")});
  // Not read without include_optimizer.
  EXPECT_TRUE(UniversalInput().Read(dir, ReadOptions{}).ok());
  auto model = ReadWithOptimizer(dir);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ErrorOf(model).find(file + ": the tensor has shape [3, 4], but fp32.pt's is [4, 3]"),
            std::string::npos)
      << ErrorOf(model);
  // One moment without the other.
  fs::remove(file);
  model = ReadWithOptimizer(dir);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ErrorOf(model).find("has exp_avg.pt but no exp_avg_sq.pt"), std::string::npos)
      << ErrorOf(model);
  // Neither (a param that never got a gradient): noted.
  fs::remove(dir + "/zero/embed.weight/exp_avg.pt");
  model = ReadWithOptimizer(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->parts[0].Find("embed.weight.exp_avg"), -1);
  EXPECT_GE(model->parts[0].Find("ln.weight.exp_avg"), 0);
  EXPECT_TRUE(
      HasEntry(model->parts[0], "embed.weight: no optimizer moments (exp_avg.pt, exp_avg_sq.pt)"));
}

TEST(UniversalInputTest, MissingFilesAndFoldersRefused) {
  const std::string dir = Folder("universal_missing");
  // A param folder without fp32.pt.
  fs::remove(dir + "/zero/ln.weight/fp32.pt");
  auto model = UniversalInput().Read(dir, ReadOptions{});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ErrorOf(model).find(dir + "/zero/ln.weight has no fp32.pt"), std::string::npos)
      << ErrorOf(model);
  // A trainable param of param_shapes without its folder: never replaced by its 16-bit copy.
  fs::remove_all(dir + "/zero/ln.weight");
  model = UniversalInput().Read(dir, ReadOptions{});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ErrorOf(model).find(dir + "/zero/ln.weight is missing: param_shapes of"),
            std::string::npos)
      << ErrorOf(model);
}

TEST(UniversalInputTest, SpecialFilesRefused) {
  const std::string dir = Folder("universal_fifo");
  // A FIFO in place of a state file is refused by the open, never read.
  const std::string fp32 = dir + "/zero/ln.weight/fp32.pt";
  fs::remove(fp32);
  ASSERT_EQ(mkfifo(fp32.c_str(), 0600), 0);
  auto model = UniversalInput().Read(dir, ReadOptions{});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  EXPECT_NE(ErrorOf(model).find("fp32.pt"), std::string::npos) << ErrorOf(model);
  fs::remove(fp32);
  fs::remove_all(dir + "/zero/ln.weight");
  // A FIFO among the param folders.
  ASSERT_EQ(mkfifo((dir + "/zero/ln.weight").c_str(), 0600), 0);
  model = UniversalInput().Read(dir, ReadOptions{});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  EXPECT_NE(ErrorOf(model).find(dir + "/zero/ln.weight is neither a regular file nor a folder"),
            std::string::npos)
      << ErrorOf(model);
}

TEST(UniversalInputTest, ParamsOutsideParamShapesAndOtherFilesAreKeptOrNoted) {
  const std::string dir = Folder("universal_extra");
  // A param folder param_shapes does not list (another pipeline stage's, or a param newer
  // ds_to_universal writes from `module`): read, after the listed ones.
  fs::create_directories(dir + "/zero/layers.10.w");
  fs::create_directories(dir + "/zero/layers.2.w");
  WriteUniversalState(dir + "/zero/layers.10.w/fp32.pt",
                      {{2}, UniversalFixtureBytes("ln.weight").substr(0, 8)});
  WriteUniversalState(dir + "/zero/layers.2.w/fp32.pt",
                      {{3}, UniversalFixtureBytes("ln.weight"), false, 1, true});
  // Another optimizer's state and a stray file are noted.
  WriteUniversalState(dir + "/zero/ln.weight/momentum_buffer.pt",
                      {{3}, UniversalFixtureBytes("ln.weight")});
  Touch(dir + "/zero/README");
  auto model = UniversalInput().Read(dir, ReadOptions{});
  ASSERT_TRUE(model.ok()) << model.status();
  const Catalog& catalog = model->parts[0];
  EXPECT_EQ(Names(catalog), (std::vector<std::string>{"embed.weight", "ln.weight", "head.bias",
                                                      "layers.2.w", "layers.10.w", "steps"}));
  EXPECT_TRUE(HasEntry(catalog, "layers.2.w.cat_dim: 1"));
  EXPECT_TRUE(HasEntry(catalog, "layers.2.w.vocab_tensor: True"));
  EXPECT_TRUE(HasEntry(catalog, "ln.weight.momentum_buffer: momentum_buffer.pt, not read"));
  EXPECT_TRUE(HasEntry(catalog, "zero/README: not read"));
  EXPECT_NE(model->description.find(", 5 parameters"), std::string::npos) << model->description;
}

// zero/ is listed once through its driver, as on every storage: other files are noted in name
// order, whatever order the folder lists them in.
TEST(UniversalInputTest, OtherFilesOfZeroAreNotedInNameOrder) {
  const std::string dir = Folder("universal_notes");
  for (const char* name : {"notes-c", "notes-a", "notes-e", "notes-b", "notes-d"}) {
    Touch(absl::StrCat(dir, "/zero/", name));
  }
  auto model = UniversalInput().Read(dir, ReadOptions{});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::string> notes;
  for (const std::string& entry : model->parts[0].other_entries) {
    if (absl::StartsWith(entry, "zero/")) notes.push_back(entry);
  }
  EXPECT_EQ(notes, (std::vector<std::string>{"zero/notes-a: not read", "zero/notes-b: not read",
                                             "zero/notes-c: not read", "zero/notes-d: not read",
                                             "zero/notes-e: not read"}));
}

TEST(UniversalInputTest, TagsAndTrackerFile) {
  const std::string root = MakeTempDir("universal_tags");
  WriteUniversalFolder(root, UniversalFolderOptions{});
  const UniversalInput input;
  ReadOptions options;
  for (const char* bad : {"../x", "a/b", "..", "step..1"}) {
    options.tag = bad;
    auto model = input.Read(root, options);
    ASSERT_FALSE(model.ok()) << bad;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  }
  options.tag = "global_step9_universal";
  auto model = input.Read(root, options);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound) << model.status();
  // --tag naming a folder that is not a universal checkpoint (the original ZeRO one).
  fs::create_directories(root + "/global_step5");
  Touch(root + "/global_step5/mp_rank_00_model_states.pt");
  options.tag = "global_step5";
  model = input.Read(root, options);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  EXPECT_NE(ErrorOf(model).find("is not a DeepSpeed universal checkpoint"), std::string::npos)
      << ErrorOf(model);
  // latest_universal naming it, an absent folder, nothing.
  options.tag = "";
  WriteAll(root + "/latest_universal", "global_step5");
  model = input.Read(root, options);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss) << model.status();
  WriteAll(root + "/latest_universal", "global_step6_universal\n");
  model = input.Read(root, options);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound) << model.status();
  EXPECT_NE(ErrorOf(model).find("global_step6_universal"), std::string::npos) << ErrorOf(model);
  WriteAll(root + "/latest_universal", "../etc");
  model = input.Read(root, options);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  WriteAll(root + "/latest_universal", "  ");
  model = input.Read(root, options);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss) << model.status();
  fs::remove(root + "/latest_universal");
  model = input.Read(root, options);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  EXPECT_NE(ErrorOf(model).find("latest_universal"), std::string::npos) << ErrorOf(model);
  model = input.Read(root + "/latest_universal", options);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
}

}  // namespace
}  // namespace reshard
