#include "lib/io/s3/curl_library.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace reshard {
namespace {

// Whether libcurl is mapped into this process.
bool CurlIsMapped() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find("/libcurl.so") != std::string::npos;
}

// The point of the library: libcurl is not loaded until an S3 client asks for it. The test
// binary links curl_library only, like reshardctl and reshardd.
TEST(CurlLibraryTest, LoadedOnFirstUseOnly) {
  ASSERT_FALSE(CurlIsMapped()) << "libcurl is linked into the binary, not loaded on demand";
  absl::StatusOr<const CurlLibrary*> curl = LoadCurlLibrary();
  ASSERT_TRUE(curl.ok()) << curl.status();
  EXPECT_TRUE(CurlIsMapped());

  // The table calls into the real library.
  const CurlLibrary& library = **curl;
  EXPECT_STREQ(library.easy_strerror(CURLE_OK), "No error");
  CURL* handle = library.easy_init();
  ASSERT_NE(handle, nullptr);
  EXPECT_EQ(library.easy_setopt(handle, CURLOPT_URL, "http://127.0.0.1:1/"), CURLE_OK);
  long status = -1;
  EXPECT_EQ(library.easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &status), CURLE_OK);
  EXPECT_EQ(status, 0);
  curl_slist* headers = library.slist_append(nullptr, "x-test: 1");
  ASSERT_NE(headers, nullptr);
  library.slist_free_all(headers);
  library.easy_reset(handle);
  library.easy_cleanup(handle);

  // Loaded once: the same table again.
  absl::StatusOr<const CurlLibrary*> again = LoadCurlLibrary();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *curl);
}

}  // namespace
}  // namespace reshard
