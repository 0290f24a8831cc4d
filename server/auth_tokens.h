// Bearer tokens of reshardd (--auth-tokens FILE): who may call, with which scopes, under which
// roots.
//
// The file is JSON, and is refused when group or others may read or write it:
//
//   {"tokens": [{"name": "alice", "sha256": "<hex SHA-256 of the token>",
//                "scopes": ["read", "submit", "cancel", "admin"],
//                "allowed_roots": ["/data/team-a"]}]}
//
// Only hashes are stored; a presented token is hashed (OpenSSL SHA-256) and compared with
// every entry in constant time. Names are what logs and job records show (never the token).
// Each token's allowed_roots are resolved at load and must lie within the daemon's
// --allowed-root folders; the token's requests are checked against them with the same rules
// as the daemon's (server/path_policy.h).
//
// Scopes: `read` (GetJob, ListJobs, WatchJob, Inspect, Plan), `submit` (SubmitJob), `cancel`
// (CancelJob), `admin` (see and cancel every token's jobs; without it, a token sees only the
// jobs it submitted).

#ifndef RESHARD_SERVER_AUTH_TOKENS_H_
#define RESHARD_SERVER_AUTH_TOKENS_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/path_policy.h"

namespace reshard {

enum class Scope : uint32_t { kRead = 1, kSubmit = 2, kCancel = 4, kAdmin = 8 };

// "read", "submit", "cancel", "admin".
absl::string_view ScopeName(Scope scope);

// An authenticated caller.
struct Caller {
  std::string name;  // the token's name; empty when tokens are off
  uint32_t scopes = 0;
  // The caller's roots (the token's allowed_roots, or the daemon's when tokens are off).
  std::shared_ptr<const PathPolicy> paths;

  bool Has(Scope scope) const { return (scopes & static_cast<uint32_t>(scope)) != 0; }
  // Whether the caller may see and cancel a job recorded with `owner`.
  bool Owns(const std::string& owner) const { return Has(Scope::kAdmin) || owner == name; }
};

// PermissionDenied naming the token and the scope when `caller` lacks `scope`.
absl::Status RequireScope(const Caller& caller, Scope scope);

// Lowercase hex SHA-256 of `text`.
std::string Sha256Hex(absl::string_view text);

class TokenTable {
 public:
  // Parses the JSON text of `file` (named in every error). Each token's roots must exist and
  // resolve inside `daemon_paths`' roots.
  static absl::StatusOr<TokenTable> Parse(absl::string_view json, const std::string& file,
                                          const PathPolicy& daemon_paths);
  // Reads `file` (refused when group or others have any permission on it) and parses it.
  static absl::StatusOr<TokenTable> Load(const std::string& file, const PathPolicy& daemon_paths);

  // The caller holding `token`; Unauthenticated when no entry has its hash.
  absl::StatusOr<Caller> Authenticate(absl::string_view token) const;
  // The entry named `name` (without checking a token), NotFound when there is none.
  absl::StatusOr<Caller> Find(const std::string& name) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    Caller caller;
    std::array<uint8_t, 32> sha256;
  };
  std::vector<Entry> entries_;
};

// The token table of a running daemon: reloadable, and the one place requests are checked.
class Authorizer {
 public:
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(std::string file,
                                                            const PathPolicy* daemon_paths);

  // Reads the file again; on error the previous tokens stay and the error names the file.
  absl::Status Reload();

  // The caller behind an `authorization` header value ("Bearer TOKEN"; empty when the call
  // had none). Unauthenticated when the header is missing, malformed or the token unknown.
  absl::StatusOr<Caller> Authenticate(absl::string_view authorization) const;
  // Authenticate, then RequireScope.
  absl::StatusOr<Caller> Authorize(absl::string_view authorization, Scope scope) const;

  // The current entry of the token `name` (jobs run under their owner's roots); NotFound
  // naming the file when the token is no longer in it.
  absl::StatusOr<Caller> Find(const std::string& name) const;

  const std::string& file() const { return file_; }

 private:
  Authorizer(std::string file, const PathPolicy* daemon_paths, TokenTable table)
      : file_(std::move(file)),
        daemon_paths_(daemon_paths),
        table_(std::make_shared<const TokenTable>(std::move(table))) {}
  std::shared_ptr<const TokenTable> table() const;

  const std::string file_;
  const PathPolicy* const daemon_paths_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokenTable> table_ ABSL_GUARDED_BY(mu_);
};

}  // namespace reshard

#endif  // RESHARD_SERVER_AUTH_TOKENS_H_
