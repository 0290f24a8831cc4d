// TLS and mutual TLS for reshardd's gRPC port, with certificates reloaded on SIGHUP.
//
// The operator's files (--tls-cert, --tls-key, --tls-client-ca) are checked with OpenSSL
// before gRPC sees them: each must parse as PEM, the key must match the certificate, and an
// error names the file and what is wrong. Checked copies go to a private snapshot folder
// (mode 0700, files 0600) that a gRPC FileWatcherCertificateProvider watches; Reload() checks
// the operator's files again and replaces the snapshot, so new certificates take effect on
// SIGHUP (within a second, the provider's refresh interval) and a broken file at reload is
// refused while the previous certificates keep serving.
//
// With a client CA, clients must present a certificate signed by it (verified by gRPC);
// without one, no client certificate is requested.

#ifndef RESHARD_SERVER_TLS_CREDENTIALS_H_
#define RESHARD_SERVER_TLS_CREDENTIALS_H_

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace reshard {

struct TlsFiles {
  std::string cert;       // PEM certificate chain of the server
  std::string key;        // PEM private key of `cert`
  std::string client_ca;  // PEM CA certificates clients must be signed by; empty: no mTLS

  bool enabled() const { return !cert.empty() || !key.empty() || !client_ca.empty(); }
};

// The contents of TlsFiles, as checked by ReadTlsFiles.
struct TlsPem {
  std::string cert, key, client_ca;
};

// Reads `files` and checks that they can serve: cert and key both given, each file PEM, the
// key unencrypted and matching the first certificate, no certificate expired, the client CA
// (when given) holding at least one certificate. InvalidArgument/NotFound naming the flag,
// the file and what is wrong.
absl::StatusOr<TlsPem> ReadTlsFiles(const TlsFiles& files);

class ServerTls {
 public:
  // Checks `files` and snapshots them into `snapshot_dir` (created, mode 0700).
  static absl::StatusOr<std::unique_ptr<ServerTls>> Create(const TlsFiles& files,
                                                           const std::string& snapshot_dir);

  // Credentials for grpc::ServerBuilder::AddListeningPort; they follow the snapshot.
  std::shared_ptr<grpc::ServerCredentials> credentials() const { return credentials_; }
  bool requires_client_certificates() const { return !files_.client_ca.empty(); }

  // Checks the operator's files again and, when they are good, replaces the snapshot; when
  // not, returns the error and the previous certificates keep serving.
  absl::Status Reload();

 private:
  ServerTls(TlsFiles files, std::string snapshot_dir)
      : files_(std::move(files)), snapshot_dir_(std::move(snapshot_dir)) {}
  absl::Status WriteSnapshot(const TlsPem& pem) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TlsFiles files_;
  const std::string snapshot_dir_;
  absl::Mutex mu_;  // one Reload at a time
  std::shared_ptr<grpc::ServerCredentials> credentials_;
};

}  // namespace reshard

#endif  // RESHARD_SERVER_TLS_CREDENTIALS_H_
