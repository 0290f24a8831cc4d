#include "server/tls_credentials.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

// A P-256 key and a certificate signed by `issuer_key` (itself when null), valid from now for
// `days` (negative: expired that many days ago), as PEM.
struct Pem {
  std::string cert, key;
};

std::string ToPem(int (*write)(BIO*, void*), void* object) {
  BIO* bio = BIO_new(BIO_s_mem());
  write(bio, object);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(size));
  BIO_free(bio);
  return pem;
}

Pem MakeCertificate(const std::string& name, int days, EVP_PKEY* issuer_key = nullptr) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), days < 0 ? (days - 1) * 86400L : -60);
  X509_gmtime_adj(X509_getm_notAfter(cert), days * 86400L);
  X509_set_pubkey(cert, key);
  X509_NAME* subject = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert, subject);
  X509_sign(cert, issuer_key != nullptr ? issuer_key : key, EVP_sha256());
  Pem pem;
  pem.cert =
      ToPem([](BIO* bio, void* x) { return PEM_write_bio_X509(bio, static_cast<X509*>(x)); }, cert);
  pem.key = ToPem(
      [](BIO* bio, void* k) {
        return PEM_write_bio_PrivateKey(bio, static_cast<EVP_PKEY*>(k), nullptr, nullptr, 0,
                                        nullptr, nullptr);
      },
      key);
  X509_free(cert);
  EVP_PKEY_free(key);
  return pem;
}

class TlsCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("tls");
    server_ = MakeCertificate("server", 2);
    other_ = MakeCertificate("other", 2);
    files_.cert = Write("server.pem", server_.cert);
    files_.key = Write("server.key", server_.key);
    files_.client_ca = Write("ca.pem", MakeCertificate("ca", 2).cert);
  }

  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = dir_ + "/" + name;
    WriteAll(path, contents);
    return path;
  }

  std::string dir_;
  Pem server_, other_;
  TlsFiles files_;
};

TEST_F(TlsCredentialsTest, ReadsMatchingFiles) {
  auto pem = ReadTlsFiles(files_);
  ASSERT_TRUE(pem.ok()) << pem.status();
  EXPECT_EQ(pem->cert, server_.cert);
  EXPECT_EQ(pem->key, server_.key);
  EXPECT_FALSE(pem->client_ca.empty());
  files_.client_ca.clear();
  EXPECT_TRUE(ReadTlsFiles(files_).ok());
}

TEST_F(TlsCredentialsTest, ErrorsNameTheFlagTheFileAndTheProblem) {
  const std::string not_pem = Write("garbage.pem", "not a certificate\n");
  const std::string expired_cert = Write("expired.pem", MakeCertificate("old", -1).cert);
  const struct {
    TlsFiles files;
    std::string expected;
  } cases[] = {
      {{files_.cert, "", ""}, "--tls-cert and --tls-key go together"},
      {{"", files_.key, ""}, "--tls-cert and --tls-key go together"},
      {{"", "", files_.client_ca}, "--tls-client-ca needs --tls-cert and --tls-key"},
      {{not_pem, files_.key, ""}, "--tls-cert " + not_pem + " holds no PEM certificate"},
      {{files_.cert, files_.cert, ""},
       "--tls-key " + files_.cert + " is not an unencrypted PEM private key"},
      {{files_.cert, Write("other.key", other_.key), ""},
       "does not match the first certificate of --tls-cert " + files_.cert},
      {{expired_cert, files_.key, ""},
       "--tls-cert " + expired_cert + ": certificate 1 of 1 has expired"},
      {{files_.cert, files_.key, not_pem},
       "--tls-client-ca " + not_pem + " holds no PEM certificate"},
      {{files_.cert, files_.key, dir_ + "/missing.pem"}, dir_ + "/missing.pem"},
  };
  for (const auto& c : cases) {
    auto pem = ReadTlsFiles(c.files);
    EXPECT_FALSE(pem.ok()) << c.expected;
    EXPECT_THAT(std::string(pem.status().message()), HasSubstr(c.expected));
  }
}

TEST_F(TlsCredentialsTest, SnapshotIsPrivateAndFollowsReloads) {
  const std::string snapshot = dir_ + "/state-tls";
  auto tls = ServerTls::Create(files_, snapshot);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_NE((*tls)->credentials(), nullptr);
  EXPECT_TRUE((*tls)->requires_client_certificates());
  struct stat st;
  ASSERT_EQ(::stat(snapshot.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((snapshot + "/current/key.pem").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(ReadAll(snapshot + "/current/cert.pem"), server_.cert);

  // A new pair replaces the snapshot; a broken one is refused and the snapshot stays.
  WriteAll(files_.cert, other_.cert);
  WriteAll(files_.key, other_.key);
  ASSERT_TRUE((*tls)->Reload().ok());
  EXPECT_EQ(ReadAll(snapshot + "/current/cert.pem"), other_.cert);
  EXPECT_EQ(ReadAll(snapshot + "/current/key.pem"), other_.key);
  WriteAll(files_.key, server_.key);  // no longer matches the certificate
  absl::Status reloaded = (*tls)->Reload();
  EXPECT_THAT(std::string(reloaded.message()), HasSubstr("the previous ones stay"));
  EXPECT_THAT(std::string(reloaded.message()), HasSubstr("does not match"));
  EXPECT_EQ(ReadAll(snapshot + "/current/key.pem"), other_.key);

  // Only the current and the previous generation are kept.
  WriteAll(files_.key, other_.key);
  ASSERT_TRUE((*tls)->Reload().ok());
  ASSERT_TRUE((*tls)->Reload().ok());
  EXPECT_NE(::access((snapshot + "/gen-0").c_str(), F_OK), 0);
  EXPECT_EQ(::access((snapshot + "/gen-2").c_str(), F_OK), 0);
  EXPECT_EQ(::access((snapshot + "/gen-3/cert.pem").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace reshard
