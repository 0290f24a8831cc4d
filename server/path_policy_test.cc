#include "server/path_policy.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

std::string Real(const std::string& path) {
  char resolved[PATH_MAX];
  EXPECT_NE(::realpath(path.c_str(), resolved), nullptr) << path;
  return resolved;
}

void Touch(const std::string& path) { std::ofstream(path) << "x"; }

// BASE/
//   root/            the allowed root
//     model.safetensors
//     sub/
//     escape -> BASE/outside      (symlink to a folder outside)
//     escape_file -> BASE/x       (symlink to a file outside)
//     inner -> BASE/root/sub      (symlink that stays inside)
//     dangling -> BASE/nowhere
//   root2/           a sibling whose name shares the root's prefix
//     file
//   outside/
//     f
//   x
class PathPolicyTest : public testing::Test {
 protected:
  void SetUp() override {
    base_ = MakeTempDir("path_policy");
    root_ = base_ + "/root";
    fs::create_directories(root_ + "/sub");
    fs::create_directories(base_ + "/root2");
    fs::create_directories(base_ + "/outside");
    Touch(root_ + "/model.safetensors");
    Touch(base_ + "/root2/file");
    Touch(base_ + "/outside/f");
    Touch(base_ + "/x");
    fs::create_directory_symlink(base_ + "/outside", root_ + "/escape");
    fs::create_symlink(base_ + "/x", root_ + "/escape_file");
    fs::create_directory_symlink(root_ + "/sub", root_ + "/inner");
    fs::create_symlink(base_ + "/nowhere", root_ + "/dangling");
    auto policy = PathPolicy::Create({root_});
    ASSERT_TRUE(policy.ok()) << policy.status();
    policy_ = std::make_unique<PathPolicy>(*std::move(policy));
    real_root_ = Real(root_);
  }

  std::string base_, root_, real_root_;
  std::unique_ptr<PathPolicy> policy_;
};

TEST_F(PathPolicyTest, RootsAreResolved) {
  ASSERT_EQ(policy_->roots().size(), 1u);
  EXPECT_EQ(policy_->roots()[0], real_root_);

  // Through a symlink, with a trailing slash and a ".." component: the same resolved root.
  fs::create_directory_symlink(root_, base_ + "/root_link");
  auto policy = PathPolicy::Create({base_ + "/root_link/", base_ + "/root/sub/../../root2"});
  ASSERT_TRUE(policy.ok()) << policy.status();
  ASSERT_EQ(policy->roots().size(), 2u);
  EXPECT_EQ(policy->roots()[0], real_root_);
  EXPECT_EQ(policy->roots()[1], Real(base_ + "/root2"));
}

TEST_F(PathPolicyTest, BadRootsAreRefused) {
  EXPECT_EQ(PathPolicy::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PathPolicy::Create({base_ + "/missing"}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(PathPolicy::Create({base_ + "/x"}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PathPolicyTest, InputInsideIsAccepted) {
  auto input = policy_->CheckInput(root_ + "/model.safetensors");
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(*input, real_root_ + "/model.safetensors");
  // A folder input, the root itself, and a symlink that stays inside.
  auto folder = policy_->CheckInput(root_ + "/sub");
  ASSERT_TRUE(folder.ok()) << folder.status();
  EXPECT_EQ(*folder, real_root_ + "/sub");
  auto itself = policy_->CheckInput(root_);
  ASSERT_TRUE(itself.ok()) << itself.status();
  EXPECT_EQ(*itself, real_root_);
  auto inner = policy_->CheckInput(root_ + "/inner");
  ASSERT_TRUE(inner.ok()) << inner.status();
  EXPECT_EQ(*inner, real_root_ + "/sub");
  // A ".." that stays inside is fine and resolved away.
  auto dotdot = policy_->CheckInput(root_ + "/sub/../model.safetensors");
  ASSERT_TRUE(dotdot.ok()) << dotdot.status();
  EXPECT_EQ(*dotdot, real_root_ + "/model.safetensors");
}

TEST_F(PathPolicyTest, InputOutsideIsDenied) {
  auto outside = policy_->CheckInput(base_ + "/x");
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kPermissionDenied) << outside.status();
  // "root2" starts with "root" but is not inside it.
  auto sibling = policy_->CheckInput(base_ + "/root2/file");
  EXPECT_EQ(sibling.status().code(), absl::StatusCode::kPermissionDenied) << sibling.status();
  EXPECT_EQ(policy_->CheckInput("/").status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(PathPolicyTest, DotDotEscapeIsDenied) {
  auto input = policy_->CheckInput(root_ + "/sub/../../x");
  EXPECT_EQ(input.status().code(), absl::StatusCode::kPermissionDenied) << input.status();
  auto output = policy_->CheckOutput(root_ + "/sub/../../out");
  EXPECT_EQ(output.status().code(), absl::StatusCode::kPermissionDenied) << output.status();
  // ".." below a folder that does not exist yet.
  auto missing = policy_->CheckOutput(root_ + "/newdir/../../out");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kPermissionDenied) << missing.status();
  auto deep = policy_->CheckOutput(root_ + "/a/b/../../../../out");
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kPermissionDenied) << deep.status();
}

TEST_F(PathPolicyTest, SymlinkOutIsDenied) {
  // As input: the link itself, a file below it, and a link to a file outside.
  auto link = policy_->CheckInput(root_ + "/escape");
  EXPECT_EQ(link.status().code(), absl::StatusCode::kPermissionDenied) << link.status();
  auto below = policy_->CheckInput(root_ + "/escape/f");
  EXPECT_EQ(below.status().code(), absl::StatusCode::kPermissionDenied) << below.status();
  auto file_link = policy_->CheckInput(root_ + "/escape_file");
  EXPECT_EQ(file_link.status().code(), absl::StatusCode::kPermissionDenied) << file_link.status();
  // As output: the link as the output folder, as its parent, as a grandparent.
  auto out_link = policy_->CheckOutput(root_ + "/escape");
  EXPECT_EQ(out_link.status().code(), absl::StatusCode::kPermissionDenied) << out_link.status();
  auto parent = policy_->CheckOutput(root_ + "/escape/out");
  EXPECT_EQ(parent.status().code(), absl::StatusCode::kPermissionDenied) << parent.status();
  auto grand = policy_->CheckOutput(root_ + "/escape/new/out");
  EXPECT_EQ(grand.status().code(), absl::StatusCode::kPermissionDenied) << grand.status();
}

TEST_F(PathPolicyTest, DanglingSymlinkOutputIsRefused) {
  auto output = policy_->CheckOutput(root_ + "/dangling");
  EXPECT_FALSE(output.ok()) << *output;
  auto below = policy_->CheckOutput(root_ + "/dangling/out");
  EXPECT_FALSE(below.ok()) << *below;
}

TEST_F(PathPolicyTest, OutputWithMissingParentsIsResolved) {
  auto output = policy_->CheckOutput(root_ + "/a/b/c");
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_EQ(*output, real_root_ + "/a/b/c");
  EXPECT_FALSE(fs::exists(root_ + "/a")) << "checking must not create folders";
  // Trailing slashes are dropped; a symlinked parent that stays inside is resolved.
  auto trailing = policy_->CheckOutput(root_ + "/a/b/c//");
  ASSERT_TRUE(trailing.ok()) << trailing.status();
  EXPECT_EQ(*trailing, real_root_ + "/a/b/c");
  auto inner = policy_->CheckOutput(root_ + "/inner/out");
  ASSERT_TRUE(inner.ok()) << inner.status();
  EXPECT_EQ(*inner, real_root_ + "/sub/out");
  // An existing folder is fine too.
  auto existing = policy_->CheckOutput(root_ + "/sub");
  ASSERT_TRUE(existing.ok()) << existing.status();
  EXPECT_EQ(*existing, real_root_ + "/sub");
}

TEST_F(PathPolicyTest, OutputEqualToRootIsDenied) {
  for (const std::string& path : {root_, root_ + "/", root_ + "/sub/..", root_ + "/inner/.."}) {
    auto output = policy_->CheckOutput(path);
    EXPECT_EQ(output.status().code(), absl::StatusCode::kPermissionDenied)
        << path << " -> " << (output.ok() ? *output : output.status().ToString());
  }
}

TEST_F(PathPolicyTest, OutputOutsideIsDenied) {
  auto output = policy_->CheckOutput(base_ + "/out");
  EXPECT_EQ(output.status().code(), absl::StatusCode::kPermissionDenied) << output.status();
  auto sibling = policy_->CheckOutput(base_ + "/root2/out");
  EXPECT_EQ(sibling.status().code(), absl::StatusCode::kPermissionDenied) << sibling.status();
}

TEST_F(PathPolicyTest, RelativeOrEmptyPathIsInvalid) {
  EXPECT_EQ(policy_->CheckInput("model.safetensors").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(policy_->CheckInput("./root/model.safetensors").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(policy_->CheckOutput("out").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(policy_->CheckInput("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(policy_->CheckOutput("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(policy_->CheckOutput("/" + std::string(5000, 'a')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PathPolicyTest, MissingInputIsNotFound) {
  auto input = policy_->CheckInput(root_ + "/missing.safetensors");
  EXPECT_EQ(input.status().code(), absl::StatusCode::kNotFound) << input.status();
  EXPECT_NE(input.status().message().find("missing.safetensors"), absl::string_view::npos);
}

// Paths out of a root are PERMISSION_DENIED (docs/cli.md, "Security"); so is a dangling
// symlink, whose target cannot be checked, rather than NOT_FOUND.
TEST_F(PathPolicyTest, DanglingOutputSymlinkIsDenied) {
  for (const std::string& path : {root_ + "/dangling", root_ + "/dangling/out"}) {
    auto output = policy_->CheckOutput(path);
    EXPECT_EQ(output.status().code(), absl::StatusCode::kPermissionDenied)
        << path << " -> " << (output.ok() ? *output : output.status().ToString());
  }
}

TEST_F(PathPolicyTest, SpecialFilesAreRefused) {
  ASSERT_EQ(::mkfifo((root_ + "/pipe.safetensors").c_str(), 0600), 0);
  auto fifo = policy_->CheckInputTree(root_ + "/pipe.safetensors");
  EXPECT_EQ(fifo.status().code(), absl::StatusCode::kInvalidArgument) << fifo.status();
  EXPECT_NE(fifo.status().message().find("FIFO"), absl::string_view::npos) << fifo.status();
  // A folder holding one, directly or through a symlink that stays inside.
  fs::create_directories(root_ + "/ckpt");
  Touch(root_ + "/ckpt/model-00001-of-00002.safetensors");
  fs::create_symlink(root_ + "/pipe.safetensors", root_ + "/ckpt/model-00002-of-00002.safetensors");
  auto tree = policy_->CheckInputTree(root_ + "/ckpt");
  EXPECT_EQ(tree.status().code(), absl::StatusCode::kInvalidArgument) << tree.status();
  EXPECT_NE(tree.status().message().find("model-00002-of-00002"), absl::string_view::npos)
      << tree.status();
  EXPECT_EQ(policy_->CheckInput("/dev/null").status().code(),
            absl::StatusCode::kPermissionDenied);  // outside first
}

TEST_F(PathPolicyTest, S3UrlsNeedAnS3Root) {
  auto output = policy_->CheckOutput("s3://bucket/out");
  EXPECT_EQ(output.status().code(), absl::StatusCode::kPermissionDenied) << output.status();
  EXPECT_NE(output.status().message().find("s3://bucket/out"), absl::string_view::npos)
      << output.status();
  EXPECT_EQ(policy_->CheckInput("s3://bucket/model").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(policy_->CheckInput("gs://bucket/model").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PathPolicyS3Test, S3RootsHoldWholeKeySegmentsBelowThem) {
  const std::string local = MakeTempDir("s3_roots_local");
  auto policy = PathPolicy::Create({local, "s3://bucket/team-a/", "s3://whole-bucket"});
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->roots()[1], "s3://bucket/team-a");
  EXPECT_EQ(policy->roots()[2], "s3://whole-bucket");

  auto input = policy->CheckInputTree("s3://bucket/team-a/models/llama/");
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(*input, "s3://bucket/team-a/models/llama");
  EXPECT_TRUE(policy->CheckInput("s3://bucket/team-a").ok()) << "a root is an input";
  EXPECT_TRUE(policy->CheckInput("s3://whole-bucket/x").ok());
  EXPECT_EQ(policy->CheckInput("s3://bucket/team-ab/x").status().code(),
            absl::StatusCode::kPermissionDenied)
      << "a prefix of a segment is not inside";
  EXPECT_EQ(policy->CheckInput("s3://bucket/x").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(policy->CheckInput("s3://bucket/team-a/../team-b/x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(policy->CheckInput("s3://Bad_Bucket/team-a/x").status().code(),
            absl::StatusCode::kInvalidArgument);

  auto output = policy->CheckOutput("s3://bucket/team-a/out/");
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_EQ(*output, "s3://bucket/team-a/out");
  EXPECT_EQ(policy->CheckOutput("s3://bucket/team-a").status().code(),
            absl::StatusCode::kPermissionDenied)
      << "outputs lie strictly inside a root";
  // Local paths still go by the local roots only.
  EXPECT_EQ(policy->CheckInput("/etc/passwd").status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(PathPolicyS3Test, OnlyS3RootsConfineEveryLocalOpen) {
  auto policy = PathPolicy::Create({"s3://bucket/jobs"});
  ASSERT_TRUE(policy.ok()) << policy.status();
  ASSERT_NE(policy->confinement(), nullptr);
  EXPECT_EQ(policy->confinement()->Open("/etc/passwd", O_RDONLY).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(policy->CheckInput("/etc/passwd").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(policy->CheckOutput("/tmp/out").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(PathPolicy::Create({"s3://bucket/a/../b"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Paths are checked against the roots of their own driver, in the spelling that driver
// confines by: mem:// roots hold mem:// paths by whole key segments, as s3:// roots hold
// s3:// ones, and neither holds the other's paths.
TEST(PathPolicyDriverTest, EachDriverIsConfinedByItsOwnRoots) {
  auto policy = PathPolicy::Create({"mem://bucket/team-a/", "s3://bucket/team-a"});
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->roots(),
            (std::vector<std::string>{"mem://bucket/team-a", "s3://bucket/team-a"}));
  auto input = policy->CheckInputTree("mem://bucket/team-a/ckpt/");
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(*input, "mem://bucket/team-a/ckpt");
  auto output = policy->CheckOutput("mem://bucket/team-a/out");
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_EQ(*output, "mem://bucket/team-a/out");
  auto sibling = policy->CheckInput("mem://bucket/team-ab/x");
  EXPECT_EQ(sibling.status().code(), absl::StatusCode::kPermissionDenied) << sibling.status();
  EXPECT_EQ(sibling.status().message(),
            "input mem://bucket/team-ab/x is not in an allowed mem:// root (mem://bucket/team-a)");
  EXPECT_EQ(policy->CheckOutput("mem://bucket/team-a").status().code(),
            absl::StatusCode::kPermissionDenied)
      << "outputs lie strictly inside a root";
  EXPECT_EQ(policy->CheckInput("mem://bucket/team-a/../b").status().code(),
            absl::StatusCode::kInvalidArgument);
  // The s3:// root does not hold mem:// paths, nor the mem:// root s3:// ones.
  EXPECT_EQ(policy->CheckInput("mem://other/x").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(policy->CheckInput("s3://bucket/team-a/x").ok());
  EXPECT_EQ(policy->CheckInput("s3://bucket/team-b/x").status().message(),
            "input s3://bucket/team-b/x is not in an allowed s3:// root (s3://bucket/team-a)");
}

TEST(PathPolicyMultiRootTest, AnyRootWorks) {
  const std::string a = MakeTempDir("root_a");
  const std::string b = MakeTempDir("root_b");
  Touch(b + "/in");
  auto policy = PathPolicy::Create({a, b});
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto input = policy->CheckInput(b + "/in");
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(*input, Real(b) + "/in");
  auto output = policy->CheckOutput(a + "/out");
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_EQ(*output, Real(a) + "/out");
}

}  // namespace
}  // namespace reshard
