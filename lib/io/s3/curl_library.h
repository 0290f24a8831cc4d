// libcurl, loaded with dlopen when the first S3 client is made instead of at process start.
//
// Linked, libcurl would make every reshardctl and reshardd process load it and the libraries it
// pulls in (GnuTLS, Kerberos, LDAP, nghttp2, libssh2, ...: about 30), a few MiB of resident
// memory in every run, S3 or not, against a peak-RSS budget of 64 MiB. Only the S3 client uses
// libcurl, through this table of the dozen functions it calls; the types and constants still
// come from <curl/curl.h>.

#ifndef RESHARD_LIB_IO_S3_CURL_LIBRARY_H_
#define RESHARD_LIB_IO_S3_CURL_LIBRARY_H_

#include <curl/curl.h>

#include "absl/status/statusor.h"

namespace reshard {

// The libcurl functions the S3 client calls, with libcurl's signatures.
struct CurlLibrary {
  CURL* (*easy_init)();
  void (*easy_cleanup)(CURL*);
  void (*easy_reset)(CURL*);
  CURLcode (*easy_setopt)(CURL*, CURLoption, ...);
  CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...);
  CURLcode (*easy_perform)(CURL*);
  const char* (*easy_strerror)(CURLcode);
  curl_slist* (*slist_append)(curl_slist*, const char*);
  void (*slist_free_all)(curl_slist*);
};

// The SONAME loaded: libcurl4-openssl-dev's runtime, libcurl4.
inline constexpr char kCurlLibraryName[] = "libcurl.so.4";

// Loads libcurl once per process (thread-safe; later calls return the same table or the same
// error) and runs curl_global_init. The library stays loaded until the process exits. Fails with
// FailedPrecondition naming the library and dlerror's reason when it is missing or lacks a
// function, Internal when curl_global_init fails.
absl::StatusOr<const CurlLibrary*> LoadCurlLibrary();

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_CURL_LIBRARY_H_
