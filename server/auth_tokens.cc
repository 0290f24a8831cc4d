#include "server/auth_tokens.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/io/kvstore/location.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

constexpr uint64_t kMaxTokenFileBytes = 1 << 20;
constexpr size_t kMaxNameLength = 64;
constexpr std::pair<Scope, absl::string_view> kScopeNames[] = {{Scope::kRead, "read"},
                                                               {Scope::kSubmit, "submit"},
                                                               {Scope::kCancel, "cancel"},
                                                               {Scope::kAdmin, "admin"}};

std::array<uint8_t, 32> Sha256(absl::string_view text) {
  std::array<uint8_t, 32> digest{};
  unsigned int size = 0;
  EVP_Digest(text.data(), text.size(), digest.data(), &size, EVP_sha256(), nullptr);
  return digest;
}

// Names reach logs and job records: letters, digits and ._@- only.
bool IsPlainName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '@' &&
        c != '-') {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::vector<std::string>> StringList(const nlohmann::json& entry, const char* key,
                                                    const std::string& where) {
  auto it = entry.find(key);
  if (it == entry.end() || !it->is_array() || it->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", key, "\" must be a non-empty list of strings"));
  }
  std::vector<std::string> out;
  for (const nlohmann::json& item : *it) {
    if (!item.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", key, "\" holds ", item.dump(), ", not a string"));
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

}  // namespace

absl::string_view ScopeName(Scope scope) {
  for (const auto& [known, name] : kScopeNames) {
    if (known == scope) return name;
  }
  return "?";
}

absl::Status RequireScope(const Caller& caller, Scope scope) {
  if (caller.Has(scope)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("token \"", caller.name, "\" lacks the scope \"", ScopeName(scope), "\""));
}

std::string Sha256Hex(absl::string_view text) {
  const std::array<uint8_t, 32> digest = Sha256(text);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view json, const std::string& file,
                                             const PathPolicy& daemon_paths) {
  nlohmann::json doc = nlohmann::json::parse(json.begin(), json.end(), nullptr,
                                             /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(file, " is not valid JSON"));
  }
  if (!doc.is_object() || !doc.contains("tokens") || !doc["tokens"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, " must be a JSON object {\"tokens\": [...]}"));
  }
  for (const auto& [key, value] : doc.items()) {
    if (key != "tokens") {
      return absl::InvalidArgumentError(absl::StrCat(file, ": unknown key \"", key, "\""));
    }
  }
  TokenTable table;
  const nlohmann::json& tokens = doc["tokens"];
  for (size_t i = 0; i < tokens.size(); ++i) {
    const nlohmann::json& entry = tokens[i];
    std::string where = absl::StrCat(file, ": tokens[", i, "]");
    if (!entry.is_object())
      return absl::InvalidArgumentError(absl::StrCat(where, " is not an object"));
    for (const auto& [key, value] : entry.items()) {
      if (key != "name" && key != "sha256" && key != "scopes" && key != "allowed_roots") {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": unknown key \"", key, "\" (expected name, sha256, scopes, allowed_roots)"));
      }
    }
    Entry parsed;
    if (!entry.contains("name") || !entry["name"].is_string() ||
        !IsPlainName(entry["name"].get<std::string>())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"name\" must be 1 to ", kMaxNameLength,
                       " letters, digits or ._@- (it is what logs show)"));
    }
    parsed.caller.name = entry["name"].get<std::string>();
    where = absl::StrCat(where, " (\"", parsed.caller.name, "\")");
    for (const Entry& other : table.entries_) {
      if (other.caller.name == parsed.caller.name) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": the name is used twice"));
      }
    }
    const std::string hex = entry.contains("sha256") && entry["sha256"].is_string()
                                ? entry["sha256"].get<std::string>()
                                : "";
    const std::string bytes = absl::HexStringToBytes(hex);
    if (hex.size() != 64 || bytes.size() != 32 ||
        absl::BytesToHexString(bytes) != absl::AsciiStrToLower(hex)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": \"sha256\" must be the 64 hex digits of the token's SHA-256 (sha256sum)"));
    }
    std::copy(bytes.begin(), bytes.end(), parsed.sha256.begin());
    for (const Entry& other : table.entries_) {
      if (other.sha256 == parsed.sha256) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": the same token as \"", other.caller.name, "\""));
      }
    }
    ASSIGN_OR_RETURN(std::vector<std::string> scopes, StringList(entry, "scopes", where));
    for (const std::string& name : scopes) {
      uint32_t bit = 0;
      for (const auto& [scope, scope_name] : kScopeNames) {
        if (name == scope_name) bit = static_cast<uint32_t>(scope);
      }
      if (bit == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": unknown scope \"", name, "\" (expected read, submit, cancel or admin)"));
      }
      parsed.caller.scopes |= bit;
    }
    ASSIGN_OR_RETURN(std::vector<std::string> roots, StringList(entry, "allowed_roots", where));
    std::vector<std::string> resolved;
    for (const std::string& root : roots) {
      const absl::StatusOr<kvstore::Location> location = kvstore::ParseLocation(root);
      if (root.empty() || !location.ok() || !location->driver->IsAbsolute(root)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": allowed root \"", root, "\" is neither an absolute path nor an s3:// URL"));
      }
      ASSIGN_OR_RETURN(
          std::string inside, daemon_paths.CheckInput(root),
          absl::StrCat(where, ": allowed root ", root,
                       " must be a folder within the daemon's --allowed-root folders"));
      resolved.push_back(inside);
    }
    ASSIGN_OR_RETURN(PathPolicy paths, PathPolicy::Create(resolved), where);
    parsed.caller.paths = std::make_shared<const PathPolicy>(std::move(paths));
    table.entries_.push_back(std::move(parsed));
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& file,
                                            const PathPolicy& daemon_paths) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening the token file ", file));
  std::string text;
  struct stat st;
  absl::Status status;
  if (::fstat(fd, &st) != 0) {
    status = ErrnoToStatus(errno, absl::StrCat("checking the token file ", file));
  } else if (!S_ISREG(st.st_mode)) {
    status = absl::InvalidArgumentError(absl::StrCat("the token file ", file, " is not a file"));
  } else if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    status = absl::PermissionDeniedError(absl::StrFormat(
        "the token file %s has mode %04o: group or others may read or write it; chmod 600 it", file,
        st.st_mode & 07777));
  } else if (static_cast<uint64_t>(st.st_size) > kMaxTokenFileBytes) {
    status = absl::InvalidArgumentError(
        absl::StrCat("the token file ", file, " is larger than ", kMaxTokenFileBytes, " bytes"));
  } else {
    text.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        status =
            n < 0
                ? ErrnoToStatus(errno, absl::StrCat("reading the token file ", file))
                : absl::DataLossError(absl::StrCat("the token file ", file, " shrank while read"));
        break;
      }
      done += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  RETURN_IF_ERROR(status);
  return Parse(text, file, daemon_paths);
}

absl::StatusOr<Caller> TokenTable::Authenticate(absl::string_view token) const {
  const std::array<uint8_t, 32> digest = Sha256(token);
  // Every entry is compared, in constant time, whichever matches.
  const Entry* found = nullptr;
  for (const Entry& entry : entries_) {
    const bool same = CRYPTO_memcmp(entry.sha256.data(), digest.data(), digest.size()) == 0;
    if (same) found = &entry;
  }
  if (found == nullptr) return absl::UnauthenticatedError("unknown bearer token");
  return found->caller;
}

absl::StatusOr<Caller> TokenTable::Find(const std::string& name) const {
  for (const Entry& entry : entries_) {
    if (entry.caller.name == name) return entry.caller;
  }
  return absl::NotFoundError(absl::StrCat("no token named \"", name, "\""));
}

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(std::string file,
                                                               const PathPolicy* daemon_paths) {
  ASSIGN_OR_RETURN(TokenTable table, TokenTable::Load(file, *daemon_paths));
  return std::unique_ptr<Authorizer>(
      new Authorizer(std::move(file), daemon_paths, std::move(table)));
}

absl::Status Authorizer::Reload() {
  ASSIGN_OR_RETURN(TokenTable table, TokenTable::Load(file_, *daemon_paths_),
                   "reloading tokens (the previous ones stay)");
  absl::MutexLock lock(&mu_);
  table_ = std::make_shared<const TokenTable>(std::move(table));
  return absl::OkStatus();
}

std::shared_ptr<const TokenTable> Authorizer::table() const {
  absl::MutexLock lock(&mu_);
  return table_;
}

absl::StatusOr<Caller> Authorizer::Authenticate(absl::string_view authorization) const {
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "this daemon requires a bearer token (metadata \"authorization: Bearer TOKEN\")");
  }
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWithIgnoreCase(authorization, kBearer) ||
      authorization.size() == kBearer.size()) {
    return absl::UnauthenticatedError("the \"authorization\" metadata must be \"Bearer TOKEN\"");
  }
  return table()->Authenticate(authorization.substr(kBearer.size()));
}

absl::StatusOr<Caller> Authorizer::Authorize(absl::string_view authorization, Scope scope) const {
  ASSIGN_OR_RETURN(Caller caller, Authenticate(authorization));
  RETURN_IF_ERROR(RequireScope(caller, scope));
  return caller;
}

absl::StatusOr<Caller> Authorizer::Find(const std::string& name) const {
  auto caller = table()->Find(name);
  if (!caller.ok()) return Annotate(caller.status(), file_);
  return caller;
}

}  // namespace reshard
