#include "server/tls_credentials.h"

#include <fcntl.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace {

constexpr uint64_t kMaxPemBytes = 1 << 20;
// How often gRPC's provider re-reads the snapshot; only Reload() changes it.
constexpr unsigned int kRefreshSeconds = 1;

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;

// Refuses to prompt for the pass phrase of an encrypted key.
int NoPassphrase(char*, int, int, void*) { return 0; }

std::unique_ptr<BIO, BioDeleter> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  auto contents = ReadSmallFile(path, kMaxPemBytes);
  if (!contents.ok()) return Annotate(contents.status(), flag);
  return contents;
}

// The certificates of a PEM file, in order; InvalidArgument when there is none or one has
// expired.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(const std::string& flag,
                                                       const std::string& path,
                                                       const std::string& pem) {
  std::vector<X509Ptr> certs;
  auto bio = MemoryBio(pem);
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr)) {
    certs.emplace_back(cert);
  }
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " ", path, " holds no PEM certificate (\"-----BEGIN CERTIFICATE-----\")"));
  }
  for (size_t i = 0; i < certs.size(); ++i) {
    if (X509_cmp_current_time(X509_get0_notAfter(certs[i].get())) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": certificate ", i + 1,
                                                     " of ", certs.size(), " has expired"));
    }
  }
  return certs;
}

// Writes `contents` to `path` (mode 0600) through a temporary name and a rename.
absl::Status WritePrivateFile(const std::string& path, const std::string& contents) {
  const std::string temporary = path + ".tmp";
  ::unlink(temporary.c_str());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("creating ", temporary));
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return ErrnoToStatus(error, absl::StrCat("writing ", temporary));
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return ErrnoToStatus(errno, absl::StrCat("closing ", temporary));
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("renaming ", temporary, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TlsPem> ReadTlsFiles(const TlsFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (files.cert.empty()) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  TlsPem pem;
  ASSIGN_OR_RETURN(pem.cert, ReadPem("--tls-cert", files.cert));
  ASSIGN_OR_RETURN(std::vector<X509Ptr> chain,
                   ParseCertificates("--tls-cert", files.cert, pem.cert));
  ASSIGN_OR_RETURN(pem.key, ReadPem("--tls-key", files.key));
  auto bio = MemoryBio(pem.key);
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key ", files.key,
                     " is not an unencrypted PEM private key (\"-----BEGIN PRIVATE KEY-----\")"));
  }
  if (X509_check_private_key(chain.front().get(), key.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key ", files.key,
                     " does not match the first certificate of --tls-cert ", files.cert));
  }
  if (!files.client_ca.empty()) {
    ASSIGN_OR_RETURN(pem.client_ca, ReadPem("--tls-client-ca", files.client_ca));
    RETURN_IF_ERROR(ParseCertificates("--tls-client-ca", files.client_ca, pem.client_ca).status());
  }
  return pem;
}

absl::StatusOr<std::unique_ptr<ServerTls>> ServerTls::Create(const TlsFiles& files,
                                                             const std::string& snapshot_dir) {
  ASSIGN_OR_RETURN(TlsPem pem, ReadTlsFiles(files));
  if (::mkdir(snapshot_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("creating the TLS snapshot folder ", snapshot_dir));
  }
  if (::chmod(snapshot_dir.c_str(), 0700) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("making ", snapshot_dir, " private"));
  }
  std::unique_ptr<ServerTls> tls(new ServerTls(files, snapshot_dir));
  {
    absl::MutexLock lock(&tls->mu_);
    RETURN_IF_ERROR(tls->WriteSnapshot(pem));
  }
  const std::string current = snapshot_dir + "/current";
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      current + "/key.pem", current + "/cert.pem",
      files.client_ca.empty() ? "" : current + "/client-ca.pem", kRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (files.client_ca.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  tls->credentials_ = grpc::experimental::TlsServerCredentials(options);
  if (tls->credentials_ == nullptr) {
    return absl::InternalError("gRPC refused the TLS server credentials");
  }
  return tls;
}

absl::Status ServerTls::Reload() {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(TlsPem pem, ReadTlsFiles(files_),
                   "reloading TLS certificates (the previous ones stay)");
  return WriteSnapshot(pem);
}

// One folder per generation, and `current` a symlink swapped by rename(2): gRPC's provider
// sees the key and certificate of one generation (it re-reads when the key's mtime changes
// under it), never a new key with an old certificate.
absl::Status ServerTls::WriteSnapshot(const TlsPem& pem) {
  struct stat st;
  int generation = 0;
  const std::string current = snapshot_dir_ + "/current";
  char target[64] = {};
  const ssize_t n = ::readlink(current.c_str(), target, sizeof(target) - 1);
  if (n > 0 && ::sscanf(target, "gen-%d", &generation) == 1) ++generation;
  const std::string name = absl::StrCat("gen-", generation);
  const std::string folder = absl::StrCat(snapshot_dir_, "/", name);
  if (::mkdir(folder.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("creating ", folder));
  }
  const std::pair<const std::string*, const char*> copies[] = {
      {&pem.key, "key.pem"}, {&pem.cert, "cert.pem"}, {&pem.client_ca, "client-ca.pem"}};
  for (const auto& [contents, target_name] : copies) {
    if (contents->empty()) continue;
    RETURN_IF_ERROR(WritePrivateFile(absl::StrCat(folder, "/", target_name), *contents));
  }
  const std::string link = current + ".tmp";
  ::unlink(link.c_str());
  if (::symlink(name.c_str(), link.c_str()) != 0 || ::rename(link.c_str(), current.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("pointing ", current, " at ", name));
  }
  // Nothing reads the generation before the previous one: remove it.
  const std::string old = absl::StrCat(snapshot_dir_, "/gen-", generation - 2);
  if (generation >= 2 && ::stat(old.c_str(), &st) == 0) {
    for (const char* file : {"key.pem", "cert.pem", "client-ca.pem"}) {
      ::unlink(absl::StrCat(old, "/", file).c_str());
    }
    ::rmdir(old.c_str());
  }
  return absl::OkStatus();
}

}  // namespace reshard
