// Files and folders for tests: fresh temporary folders and whole-file reads and writes.
// testonly: failures are reported through GoogleTest.

#ifndef RESHARD_LIB_TESTING_TEST_FILES_H_
#define RESHARD_LIB_TESTING_TEST_FILES_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace reshard {

// A new, empty folder under the test's temporary directory, named after `tag`; the path is
// normalized (no "//"). Fails the test (ADD_FAILURE) when it cannot be made.
std::string MakeTempDir(const std::string& tag = "test");

// The whole contents of `path`; fails the test when it cannot be read.
std::string ReadAll(const std::string& path);

// Replaces `path` with `data`; fails the test when it cannot be written.
void WriteAll(const std::string& path, const std::string& data);

// `size` deterministic, position-dependent bytes (a linear congruential sequence from `seed`),
// so that data read from a misplaced range shows up.
std::string TestPattern(size_t size, uint32_t seed = 0);

// How many pages of `path` are in the page cache now (mincore of a fresh mapping); -1 when the
// file cannot be mapped. An empty file has none.
int64_t CachedPages(const std::string& path);

// How many pages of the mapping [address, address + size) this process has mapped now
// (/proc/self/pagemap's present bit: its resident set, whatever the page cache holds); -1 when
// the kernel does not say.
int64_t MappedPages(const void* address, uint64_t size);

}  // namespace reshard

#endif  // RESHARD_LIB_TESTING_TEST_FILES_H_
