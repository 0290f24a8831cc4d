#include "server/auth_tokens.h"

#include <sys/stat.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/testing/test_files.h"
#include "server/path_policy.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

class AuthTokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = MakeTempDir("auth");
    root_ = base_ + "/root";
    ASSERT_EQ(::mkdir(root_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((root_ + "/team-a").c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((root_ + "/team-b").c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((base_ + "/outside").c_str(), 0755), 0);
    auto policy = PathPolicy::Create({root_});
    ASSERT_TRUE(policy.ok()) << policy.status();
    daemon_paths_ = std::make_unique<PathPolicy>(*std::move(policy));
  }

  // One token entry as JSON.
  std::string Entry(const std::string& name, const std::string& token, const std::string& scopes,
                    const std::string& root) {
    return absl::StrCat(R"({"name": ")", name, R"(", "sha256": ")", Sha256Hex(token),
                        R"(", "scopes": [)", scopes, R"(], "allowed_roots": [")", root, R"("]})");
  }

  // A file of one token: `fields` (JSON members but allowed_roots) and one root.
  static std::string One(const std::string& fields, const std::string& root) {
    return absl::StrCat(R"({"tokens": [{)", fields, R"(, "allowed_roots": [")", root, R"("]}]})");
  }

  std::string TwoTokens() {
    return absl::StrCat(R"({"tokens": [)",
                        Entry("alice", "alice-secret", R"("read", "submit")", root_ + "/team-a"),
                        ", ", Entry("root", "root-secret", R"("read", "admin")", root_), "]}");
  }

  std::string WriteTokenFile(const std::string& json, mode_t mode = 0600) {
    const std::string path = base_ + "/tokens.json";
    WriteAll(path, json);
    EXPECT_EQ(::chmod(path.c_str(), mode), 0);
    return path;
  }

  absl::Status ParseError(const std::string& json) {
    return TokenTable::Parse(json, "tokens.json", *daemon_paths_).status();
  }

  std::string base_, root_;
  std::unique_ptr<PathPolicy> daemon_paths_;
};

TEST_F(AuthTokensTest, Sha256HexIsTheStandardDigest) {
  // sha256sum of "abc" (FIPS 180-2 test vector).
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_F(AuthTokensTest, AuthenticatesByHashWithScopesAndRoots) {
  auto table = TokenTable::Parse(TwoTokens(), "tokens.json", *daemon_paths_);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  auto alice = table->Authenticate("alice-secret");
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->name, "alice");
  EXPECT_TRUE(alice->Has(Scope::kRead));
  EXPECT_TRUE(alice->Has(Scope::kSubmit));
  EXPECT_FALSE(alice->Has(Scope::kCancel));
  EXPECT_FALSE(alice->Has(Scope::kAdmin));
  EXPECT_TRUE(alice->Owns("alice"));
  EXPECT_FALSE(alice->Owns("root"));
  EXPECT_TRUE(alice->paths->CheckOutput(root_ + "/team-a/out").ok());
  EXPECT_EQ(alice->paths->CheckOutput(root_ + "/team-b/out").status().code(),
            absl::StatusCode::kPermissionDenied);
  auto root = table->Authenticate("root-secret");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_TRUE(root->Owns("alice"));
  EXPECT_TRUE(root->paths->CheckOutput(root_ + "/team-b/out").ok());

  for (const char* wrong : {"", "alice-secre", "alice-secret ", "ALICE-SECRET"}) {
    EXPECT_EQ(table->Authenticate(wrong).status().code(), absl::StatusCode::kUnauthenticated)
        << wrong;
  }
}

// Tokens can be given s3:// prefixes within the daemon's s3:// roots.
TEST_F(AuthTokensTest, S3RootsWithinTheDaemonsS3Roots) {
  auto daemon = PathPolicy::Create({root_, "s3://shared/teams"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto table = TokenTable::Parse(
      absl::StrCat(R"({"tokens": [)",
                   Entry("alice", "alice-secret", R"("submit")", "s3://shared/teams/a"), "]}"),
      "tokens.json", *daemon);
  ASSERT_TRUE(table.ok()) << table.status();
  auto alice = table->Authenticate("alice-secret");
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_TRUE(alice->paths->CheckOutput("s3://shared/teams/a/out").ok());
  EXPECT_EQ(alice->paths->CheckOutput("s3://shared/teams/b/out").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(alice->paths->CheckInput(root_ + "/team-a").status().code(),
            absl::StatusCode::kPermissionDenied)
      << "a token with only an s3:// root reads no local folder";

  auto outside = TokenTable::Parse(
      absl::StrCat(R"({"tokens": [)",
                   Entry("bob", "bob-secret", R"("submit")", "s3://shared/other"), "]}"),
      "tokens.json", *daemon);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kPermissionDenied) << outside.status();
  EXPECT_THAT(std::string(outside.status().message()), HasSubstr("s3://shared/other"));
}

TEST_F(AuthTokensTest, UppercaseHashIsAccepted) {
  std::string json = TwoTokens();
  const std::string hex = Sha256Hex("alice-secret");
  std::string upper = hex;
  for (char& c : upper) c = static_cast<char>(toupper(c));
  json = absl::StrReplaceAll(json, {{hex, upper}});
  auto table = TokenTable::Parse(json, "tokens.json", *daemon_paths_);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_TRUE(table->Authenticate("alice-secret").ok());
}

TEST_F(AuthTokensTest, ErrorsNameTheFileTheEntryAndTheProblem) {
  const std::string a = root_ + "/team-a";
  const std::string hash = Sha256Hex("t");
  const struct {
    std::string json;
    std::string expected;
  } cases[] = {
      {"{", "tokens.json is not valid JSON"},
      {"[]", "must be a JSON object"},
      {R"({"tokens": [], "extra": 1})", "unknown key \"extra\""},
      {R"({"tokens": [1]})", "tokens[0] is not an object"},
      {One(R"("name": "a b", "sha256": ")" + hash + R"(", "scopes": ["read"])", a),
       "\"name\" must be"},
      {One(R"("name": "a", "sha256": "abc", "scopes": ["read"])", a),
       "tokens[0] (\"a\"): \"sha256\" must be the 64 hex digits"},
      {One(R"("name": "a", "sha256": ")" + std::string(64, 'g') + R"(", "scopes": ["read"])", a),
       "\"sha256\" must be"},
      {One(R"("name": "a", "sha256": ")" + hash + R"(", "scopes": ["write"])", a),
       "unknown scope \"write\""},
      {One(R"("name": "a", "sha256": ")" + hash + R"(", "scopes": [])", a),
       "\"scopes\" must be a non-empty list"},
      {One(R"("name": "a", "sha256": ")" + hash + R"(", "scopes": ["read"])", "relative"),
       "allowed root \"relative\" is neither an absolute path nor an s3:// URL"},
      {One(R"("name": "a", "sha256": ")" + hash + R"(", "scopes": ["read"])", base_ + "/outside"),
       "must be a folder within the daemon's --allowed-root folders"},
      {One(R"("name": "a", "sha256": ")" + hash + R"(", "scopes": ["read"])", a + "/missing"),
       "must be a folder within"},
      {One(R"("name": "a", "sha256": ")" + hash + R"(", "scope": ["read"])", a),
       "unknown key \"scope\""},
      {absl::StrCat(R"({"tokens": [)", Entry("a", "t", R"("read")", a), ", ",
                    Entry("a", "u", R"("read")", a), "]}"),
       "tokens[1] (\"a\"): the name is used twice"},
      {absl::StrCat(R"({"tokens": [)", Entry("a", "t", R"("read")", a), ", ",
                    Entry("b", "t", R"("read")", a), "]}"),
       "tokens[1] (\"b\"): the same token as \"a\""},
  };
  for (const auto& c : cases) {
    absl::Status status = ParseError(c.json);
    EXPECT_FALSE(status.ok()) << c.json;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.expected)) << c.json;
    EXPECT_THAT(std::string(status.message()), HasSubstr("tokens.json")) << c.json;
  }
}

TEST_F(AuthTokensTest, FileReadableByOthersIsRefused) {
  for (mode_t mode : {0644, 0640, 0604, 0620, 0602}) {
    const std::string path = WriteTokenFile(TwoTokens(), mode);
    auto table = TokenTable::Load(path, *daemon_paths_);
    EXPECT_EQ(table.status().code(), absl::StatusCode::kPermissionDenied) << mode;
    EXPECT_THAT(std::string(table.status().message()), HasSubstr(path));
    EXPECT_THAT(std::string(table.status().message()), HasSubstr("chmod 600"));
  }
  const std::string path = WriteTokenFile(TwoTokens(), 0400);
  EXPECT_TRUE(TokenTable::Load(path, *daemon_paths_).ok());
  auto missing = TokenTable::Load(base_ + "/none.json", *daemon_paths_);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(base_ + "/none.json"));
}

TEST_F(AuthTokensTest, AuthorizerChecksHeaderAndScope) {
  auto auth = Authorizer::Create(WriteTokenFile(TwoTokens()), daemon_paths_.get());
  ASSERT_TRUE(auth.ok()) << auth.status();
  const Authorizer& a = **auth;
  EXPECT_EQ(a.Authorize("", Scope::kRead).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authorize("alice-secret", Scope::kRead).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authorize("Basic alice-secret", Scope::kRead).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authorize("Bearer ", Scope::kRead).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authorize("Bearer nobody", Scope::kRead).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(a.Authorize("Bearer alice-secret", Scope::kSubmit).ok());
  EXPECT_TRUE(a.Authorize("bearer alice-secret", Scope::kRead).ok());
  auto denied = a.Authorize("Bearer alice-secret", Scope::kCancel);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(denied.status().message()),
              HasSubstr("\"alice\" lacks the scope \"cancel\""));
  EXPECT_THAT(std::string(denied.status().message()), ::testing::Not(HasSubstr("alice-secret")));
}

TEST_F(AuthTokensTest, ReloadAddsTokensAndKeepsTheOldOnesOnError) {
  const std::string path = WriteTokenFile(TwoTokens());
  auto auth = Authorizer::Create(path, daemon_paths_.get());
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->Authorize("Bearer carol-secret", Scope::kRead).status().code(),
            absl::StatusCode::kUnauthenticated);
  WriteTokenFile(absl::StrCat(
      R"({"tokens": [)", Entry("carol", "carol-secret", R"("read")", root_ + "/team-b"), "]}"));
  ASSERT_TRUE((*auth)->Reload().ok());
  EXPECT_TRUE((*auth)->Authorize("Bearer carol-secret", Scope::kRead).ok());
  EXPECT_FALSE((*auth)->Authorize("Bearer alice-secret", Scope::kRead).ok());
  EXPECT_TRUE((*auth)->Find("carol").ok());
  EXPECT_EQ((*auth)->Find("alice").status().code(), absl::StatusCode::kNotFound);

  WriteTokenFile("{broken");
  absl::Status reloaded = (*auth)->Reload();
  EXPECT_EQ(reloaded.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(reloaded.message()), HasSubstr("the previous ones stay"));
  EXPECT_THAT(std::string(reloaded.message()), HasSubstr(path));
  EXPECT_TRUE((*auth)->Authorize("Bearer carol-secret", Scope::kRead).ok());
}

}  // namespace
}  // namespace reshard
