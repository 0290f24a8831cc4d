#include "lib/io/kvstore/location.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/io/kvstore/posix_driver.h"
#include "lib/testing/status_matchers.h"

namespace reshard {
namespace kvstore {
namespace {

using ::testing::HasSubstr;

TEST(LocationTest, PathsWithoutSchemeArePosix) {
  for (const char* path : {"/data/ckpt", "ckpt", "./a:b", "", "1s3://x", "a b://c"}) {
    SCOPED_TRACE(path);
    absl::StatusOr<Location> location = ParseLocation(path);
    ASSERT_OK(location);
    EXPECT_EQ(location->driver, &GetPosixDriver());
    EXPECT_EQ(location->path, path);
  }
}

TEST(LocationTest, MemIsBuiltInAndUnknownSchemesAreUnimplemented) {
  absl::StatusOr<Location> mem = ParseLocation("mem://b/x");
  ASSERT_OK(mem);
  EXPECT_EQ(mem->driver, &GetMemoryDriver());
  EXPECT_EQ(mem->path, "mem://b/x");
  absl::Status unknown = ParseLocation("gs://bucket/key").status();
  EXPECT_TRUE(absl::IsUnimplemented(unknown)) << unknown;
  EXPECT_THAT(unknown.message(), HasSubstr("gs://bucket/key"));
  EXPECT_THAT(unknown.message(), HasSubstr("mem://"));
}

TEST(LocationTest, RegisteredDriversServeTheirScheme) {
  auto* driver = new MemoryDriver("testmem");  // registered drivers are never destroyed
  RegisterDriver(driver);
  absl::StatusOr<Location> location = ParseLocation("testmem://b/x");
  ASSERT_OK(location);
  EXPECT_EQ(location->driver, driver);
  EXPECT_EQ(SchemeOf("s3+x.y-z://b"), "s3+x.y-z");
  EXPECT_TRUE(HasScheme("s3://b"));
  EXPECT_FALSE(HasScheme("://b"));
  EXPECT_TRUE(HasScheme("hf+https://x"));
  EXPECT_FALSE(HasScheme("/data/s3://x"));
  EXPECT_FALSE(HasScheme("relative/out"));
  EXPECT_FALSE(HasScheme("1s3://x"));
}

}  // namespace
}  // namespace kvstore
}  // namespace reshard
