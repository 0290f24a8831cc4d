#include "lib/io/s3/s3_config.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

EnvLookup FakeEnv(std::map<std::string, std::string> values) {
  return [values](const std::string& name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

constexpr char kCredentialsFile[] = R"(# comment
[default]
aws_access_key_id = DEFAULTKEY
aws_secret_access_key = defaultsecret

[other]
AWS_ACCESS_KEY_ID=OTHERKEY
aws_secret_access_key=othersecret
aws_session_token = othertoken
[broken]
aws_access_key_id = ONLYKEY
)";

std::string WriteCredentials(const std::string& dir) {
  const std::string path = dir + "/credentials";
  std::ofstream(path) << kCredentialsFile;
  return path;
}

TEST(S3ConfigTest, EnvironmentCredentialsAndEndpoint) {
  absl::StatusOr<S3Config> config = S3ConfigFromEnv(FakeEnv({
      {"AWS_ACCESS_KEY_ID", "AKID"},
      {"AWS_SECRET_ACCESS_KEY", "SECRET"},
      {"AWS_SESSION_TOKEN", "TOKEN"},
      {"AWS_REGION", "eu-west-1"},
      {"AWS_ENDPOINT_URL", "http://127.0.0.1:7480/"},
  }));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->credentials.access_key_id, "AKID");
  EXPECT_EQ(config->credentials.secret_access_key, "SECRET");
  EXPECT_EQ(config->credentials.session_token, "TOKEN");
  EXPECT_EQ(config->credentials.source, "environment");
  EXPECT_EQ(config->region, "eu-west-1");
  EXPECT_EQ(config->endpoint, "http://127.0.0.1:7480");
  EXPECT_TRUE(config->path_style);
}

TEST(S3ConfigTest, DefaultsToUsEast1AndAwsEndpoint) {
  absl::StatusOr<S3Config> config =
      S3ConfigFromEnv(FakeEnv({{"AWS_ACCESS_KEY_ID", "A"}, {"AWS_SECRET_ACCESS_KEY", "S"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->region, "us-east-1");
  EXPECT_EQ(config->endpoint, "https://s3.us-east-1.amazonaws.com");
  EXPECT_FALSE(config->path_style);
  EXPECT_EQ(config->credentials.session_token, "");
}

TEST(S3ConfigTest, HalfSetEnvironmentIsAnError) {
  absl::StatusOr<S3Config> config = S3ConfigFromEnv(FakeEnv({{"AWS_ACCESS_KEY_ID", "A"}}));
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(S3ConfigTest, BadEndpoint) {
  for (const char* endpoint : {"127.0.0.1:7480", "http://host/path", "ftp://x"}) {
    absl::StatusOr<S3Config> config = S3ConfigFromEnv(FakeEnv({{"AWS_ACCESS_KEY_ID", "A"},
                                                               {"AWS_SECRET_ACCESS_KEY", "S"},
                                                               {"AWS_ENDPOINT_URL", endpoint}}));
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << endpoint;
    EXPECT_THAT(config.status().message(), HasSubstr(endpoint));
  }
}

TEST(S3ConfigTest, SharedCredentialsFileDefaultProfileFromHome) {
  const std::string home = MakeTempDir();
  std::filesystem::create_directories(home + "/.aws");
  WriteCredentials(home + "/.aws");
  absl::StatusOr<S3Config> config = S3ConfigFromEnv(FakeEnv({{"HOME", home}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->credentials.access_key_id, "DEFAULTKEY");
  EXPECT_EQ(config->credentials.secret_access_key, "defaultsecret");
  EXPECT_THAT(config->credentials.source, HasSubstr("[default]"));
  EXPECT_THAT(config->credentials.source, Not(HasSubstr("secret")));
}

TEST(S3ConfigTest, SharedCredentialsFileNamedProfile) {
  const std::string path = WriteCredentials(MakeTempDir());
  absl::StatusOr<S3Config> config =
      S3ConfigFromEnv(FakeEnv({{"AWS_SHARED_CREDENTIALS_FILE", path}, {"AWS_PROFILE", "other"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->credentials.access_key_id, "OTHERKEY");
  EXPECT_EQ(config->credentials.session_token, "othertoken");
}

TEST(S3ConfigTest, EnvironmentWinsOverFile) {
  const std::string path = WriteCredentials(MakeTempDir());
  absl::StatusOr<S3Config> config = S3ConfigFromEnv(FakeEnv({{"AWS_SHARED_CREDENTIALS_FILE", path},
                                                             {"AWS_ACCESS_KEY_ID", "ENVKEY"},
                                                             {"AWS_SECRET_ACCESS_KEY", "S"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->credentials.access_key_id, "ENVKEY");
}

TEST(S3ConfigTest, MissingOrIncompleteProfile) {
  const std::string path = WriteCredentials(MakeTempDir());
  absl::StatusOr<S3Config> missing =
      S3ConfigFromEnv(FakeEnv({{"AWS_SHARED_CREDENTIALS_FILE", path}, {"AWS_PROFILE", "nope"}}));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("[nope]"));
  EXPECT_THAT(missing.status().message(), HasSubstr(path));

  absl::StatusOr<S3Config> broken =
      S3ConfigFromEnv(FakeEnv({{"AWS_SHARED_CREDENTIALS_FILE", path}, {"AWS_PROFILE", "broken"}}));
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(broken.status().message(), HasSubstr("aws_secret_access_key"));
}

TEST(S3ConfigTest, NoCredentialsAnywhere) {
  const std::string home = MakeTempDir();
  absl::StatusOr<S3Config> config = S3ConfigFromEnv(FakeEnv({{"HOME", home}}));
  EXPECT_EQ(config.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(config.status().message(), HasSubstr("AWS_ACCESS_KEY_ID"));
  EXPECT_THAT(config.status().message(), HasSubstr(home + "/.aws/credentials"));
}

TEST(S3ConfigTest, MalformedFile) {
  absl::StatusOr<S3Credentials> credentials =
      ParseSharedCredentials("[default\nx=y\n", "default", "/f");
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(credentials.status().message(), HasSubstr("/f:1"));
}

// ~/.aws/config: region and endpoint_url of the profile, below the environment.
TEST(S3ConfigTest, ConfigFileRegionAndEndpointOfTheProfile) {
  const std::string dir = ::testing::TempDir();
  const std::string config = dir + "/aws_config";
  std::ofstream(config) << R"([default]
region = eu-west-1
[profile ceph]
region = us-west-2
endpoint_url = http://127.0.0.1:7480/
s3 =
  addressing_style = path
)";
  const std::string credentials = WriteCredentials(dir);
  auto base = [&](std::map<std::string, std::string> extra) {
    std::map<std::string, std::string> env = {{"AWS_CONFIG_FILE", config},
                                              {"AWS_SHARED_CREDENTIALS_FILE", credentials}};
    env.insert(extra.begin(), extra.end());
    return FakeEnv(env);
  };
  auto by_default = S3ConfigFromEnv(base({}));
  ASSERT_TRUE(by_default.ok()) << by_default.status();
  EXPECT_EQ(by_default->region, "eu-west-1");
  EXPECT_EQ(by_default->endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_FALSE(by_default->path_style);

  auto ceph = S3ConfigFromEnv(base({{"AWS_PROFILE", "other"}}));
  ASSERT_TRUE(ceph.ok()) << ceph.status();
  EXPECT_EQ(ceph->region, "us-east-1") << "profile [other] has no section in the config file";

  // The config section of profile "ceph" is "[profile ceph]"; its credentials are in "other".
  std::ofstream(dir + "/credentials2")
      << "[ceph]\naws_access_key_id = K\naws_secret_access_key = S\n";
  auto named = S3ConfigFromEnv(FakeEnv({{"AWS_CONFIG_FILE", config},
                                        {"AWS_SHARED_CREDENTIALS_FILE", dir + "/credentials2"},
                                        {"AWS_PROFILE", "ceph"}}));
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->region, "us-west-2");
  EXPECT_EQ(named->endpoint, "http://127.0.0.1:7480");
  EXPECT_TRUE(named->path_style);

  auto env_wins = S3ConfigFromEnv(
      base({{"AWS_REGION", "ap-south-1"}, {"AWS_ENDPOINT_URL", "http://localhost:9000"}}));
  ASSERT_TRUE(env_wins.ok()) << env_wins.status();
  EXPECT_EQ(env_wins->region, "ap-south-1");
  EXPECT_EQ(env_wins->endpoint, "http://localhost:9000");
}

TEST(S3ConfigTest, MissingConfigFileIsFineMalformedIsNot) {
  const std::string dir = ::testing::TempDir();
  const std::string credentials = WriteCredentials(dir);
  auto missing = S3ConfigFromEnv(FakeEnv({{"AWS_CONFIG_FILE", dir + "/no-such-config"},
                                          {"AWS_SHARED_CREDENTIALS_FILE", credentials}}));
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->region, "us-east-1");
  std::ofstream(dir + "/bad_config") << "[default]\nregion eu-west-1\n";
  auto bad = S3ConfigFromEnv(FakeEnv(
      {{"AWS_CONFIG_FILE", dir + "/bad_config"}, {"AWS_SHARED_CREDENTIALS_FILE", credentials}}));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("bad_config:2"));
}

}  // namespace
}  // namespace reshard
