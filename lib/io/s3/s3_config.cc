#include "lib/io/s3/s3_config.h"

#include <stdlib.h>

#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "lib/core/status.h"

namespace reshard {
namespace {

// Credentials files are a few hundred bytes; anything huge is not one.
constexpr size_t kMaxCredentialsFileBytes = 1 << 20;

std::string NonEmpty(const EnvLookup& env, const std::string& name) {
  std::optional<std::string> value = env(name);
  return value.has_value() ? *value : std::string();
}

absl::StatusOr<std::string> NormalizeEndpoint(std::string endpoint) {
  while (absl::EndsWith(endpoint, "/")) endpoint.pop_back();
  if (!absl::StartsWith(endpoint, "http://") && !absl::StartsWith(endpoint, "https://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("AWS_ENDPOINT_URL \"", endpoint, "\" must start with http:// or https://"));
  }
  absl::string_view host = absl::StripPrefix(absl::StripPrefix(endpoint, "http://"), "https://");
  if (host.empty() || absl::StrContains(host, "/") || absl::StrContains(host, "?")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AWS_ENDPOINT_URL \"", endpoint, "\" must be scheme://host[:port] without a path"));
  }
  return endpoint;
}

// The keys (lower case) and values of section `section` of an INI-style AWS file; NotFound
// when the file has no such section. `path` is only used in messages.
absl::StatusOr<std::map<std::string, std::string>> ParseIniSection(absl::string_view text,
                                                                   absl::string_view section,
                                                                   absl::string_view path) {
  std::map<std::string, std::string> values;
  bool in_section = false;
  bool found = false;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[') {
      if (line.back() != ']') {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", line_number, ": malformed section header"));
      }
      absl::string_view name = absl::StripAsciiWhitespace(line.substr(1, line.size() - 2));
      in_section = name == section;
      found = found || in_section;
      continue;
    }
    if (!in_section) continue;
    const size_t eq = line.find('=');
    // A nested block ("s3 =" then indented "key = value" lines) reads as keys of the section;
    // reshard uses none of them.
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_number, ": expected key = value"));
    }
    values[absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, eq)))] =
        std::string(absl::StripAsciiWhitespace(line.substr(eq + 1)));
  }
  if (!found) {
    return absl::NotFoundError(absl::StrCat(path, " has no section [", section, "]"));
  }
  return values;
}

// Reads a whole AWS file of at most kMaxCredentialsFileBytes; NotFound when it cannot be opened.
absl::StatusOr<std::string> ReadAwsFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", what, " ", path));
  std::string text(kMaxCredentialsFileBytes + 1, '\0');
  in.read(text.data(), text.size());
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxCredentialsFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is larger than 1 MiB"));
  }
  return text;
}

// Profile `profile` of the AWS config file (AWS_CONFIG_FILE, default ~/.aws/config): section
// [default] or [profile NAME]. Empty when the file or the profile does not exist.
absl::StatusOr<std::map<std::string, std::string>> ConfigFileProfile(const EnvLookup& env,
                                                                     const std::string& profile) {
  std::string path = NonEmpty(env, "AWS_CONFIG_FILE");
  if (path.empty()) {
    const std::string home = NonEmpty(env, "HOME");
    if (home.empty()) return std::map<std::string, std::string>();
    path = absl::StrCat(home, "/.aws/config");
  }
  absl::StatusOr<std::string> text = ReadAwsFile(path, "AWS config file");
  if (absl::IsNotFound(text.status())) return std::map<std::string, std::string>();
  RETURN_IF_ERROR(text.status());
  auto values = ParseIniSection(
      *text, profile == "default" ? profile : absl::StrCat("profile ", profile), path);
  if (absl::IsNotFound(values.status())) return std::map<std::string, std::string>();
  return values;
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = ::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

absl::StatusOr<S3Credentials> ParseSharedCredentials(absl::string_view text,
                                                     absl::string_view profile,
                                                     absl::string_view path) {
  auto values = ParseIniSection(text, profile, path);
  if (absl::IsNotFound(values.status())) {
    return absl::NotFoundError(
        absl::StrCat("shared credentials file ", path, " has no profile [", profile, "]"));
  }
  RETURN_IF_ERROR(values.status());
  S3Credentials credentials;
  credentials.source = absl::StrCat(path, " [", profile, "]");
  credentials.access_key_id = (*values)["aws_access_key_id"];
  credentials.secret_access_key = (*values)["aws_secret_access_key"];
  credentials.session_token = (*values)["aws_session_token"];
  if (credentials.access_key_id.empty() || credentials.secret_access_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared credentials file ", path, " profile [", profile,
                     "] needs both aws_access_key_id and aws_secret_access_key"));
  }
  return credentials;
}

absl::StatusOr<S3Credentials> ReadSharedCredentials(const std::string& path,
                                                    absl::string_view profile) {
  ASSIGN_OR_RETURN(std::string text, ReadAwsFile(path, "shared credentials file"));
  return ParseSharedCredentials(text, profile, path);
}

absl::StatusOr<S3Config> S3ConfigFromEnv(const EnvLookup& env) {
  S3Config config;
  const std::string profile_env = NonEmpty(env, "AWS_PROFILE");
  const std::string profile = profile_env.empty() ? "default" : profile_env;
  ASSIGN_OR_RETURN(auto profile_config, ConfigFileProfile(env, profile));
  const std::string region = NonEmpty(env, "AWS_REGION");
  const std::string default_region = NonEmpty(env, "AWS_DEFAULT_REGION");
  if (!region.empty()) {
    config.region = region;
  } else if (!default_region.empty()) {
    config.region = default_region;
  } else if (!profile_config["region"].empty()) {
    config.region = profile_config["region"];
  }
  for (char c : config.region) {
    if (!absl::ascii_isalnum(c) && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat("invalid AWS region \"", config.region, "\""));
    }
  }

  std::string endpoint = NonEmpty(env, "AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = profile_config["endpoint_url"];
  if (!endpoint.empty()) {
    ASSIGN_OR_RETURN(config.endpoint, NormalizeEndpoint(endpoint));
    config.path_style = true;
  } else {
    config.endpoint = absl::StrCat("https://s3.", config.region, ".amazonaws.com");
    config.path_style = false;
  }

  const std::string key_id = NonEmpty(env, "AWS_ACCESS_KEY_ID");
  const std::string secret = NonEmpty(env, "AWS_SECRET_ACCESS_KEY");
  if (!key_id.empty() || !secret.empty()) {
    if (key_id.empty() || secret.empty()) {
      return absl::InvalidArgumentError(
          "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together");
    }
    config.credentials.access_key_id = key_id;
    config.credentials.secret_access_key = secret;
    config.credentials.session_token = NonEmpty(env, "AWS_SESSION_TOKEN");
    config.credentials.source = "environment";
    return config;
  }

  std::string path = NonEmpty(env, "AWS_SHARED_CREDENTIALS_FILE");
  if (path.empty()) {
    const std::string home = NonEmpty(env, "HOME");
    if (!home.empty()) path = absl::StrCat(home, "/.aws/credentials");
  }
  if (!path.empty()) {
    absl::StatusOr<S3Credentials> credentials = ReadSharedCredentials(path, profile);
    if (credentials.ok()) {
      config.credentials = *std::move(credentials);
      return config;
    }
    // A missing file or profile is only an error when the user asked for that file or profile.
    const bool explicit_choice =
        !profile_env.empty() || !NonEmpty(env, "AWS_SHARED_CREDENTIALS_FILE").empty();
    if (!absl::IsNotFound(credentials.status()) || explicit_choice) {
      return credentials.status();
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or profile [", profile,
      "] in ", path.empty() ? std::string("~/.aws/credentials (HOME unset)") : path));
}

}  // namespace reshard
