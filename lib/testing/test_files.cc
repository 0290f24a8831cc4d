#include "lib/testing/test_files.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "gtest/gtest.h"

namespace reshard {

std::string MakeTempDir(const std::string& tag) {
  std::string pattern = testing::TempDir() + "/" + tag + "_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "cannot create " << pattern;
  return std::filesystem::path(pattern).lexically_normal().string();
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ADD_FAILURE() << "cannot read " << path;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) ADD_FAILURE() << "cannot write " << path;
}

int64_t CachedPages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return -1;
  }
  if (st.st_size == 0) {
    ::close(fd);
    return 0;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* address = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (address == MAP_FAILED) return -1;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((size + page - 1) / page);
  int64_t cached = -1;
  if (::mincore(address, size, resident.data()) == 0) {
    cached = 0;
    for (unsigned char r : resident) cached += r & 1;
  }
  ::munmap(address, size);
  return cached;
}

std::string TestPattern(size_t size, uint32_t seed) {
  std::string out(size, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < size; ++i) {
    x = x * 1664525u + 1013904223u;
    out[i] = static_cast<char>(x >> 24);
  }
  return out;
}

int64_t MappedPages(const void* address, uint64_t size) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t first = reinterpret_cast<uintptr_t>(address) / page;
  const uint64_t pages = (size + page - 1) / page;
  if (pages == 0) return 0;
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::vector<uint64_t> entries(pages);
  const ssize_t n = ::pread(fd, entries.data(), pages * 8, static_cast<off_t>(first * 8));
  ::close(fd);
  if (n != static_cast<ssize_t>(pages * 8)) return -1;
  int64_t present = 0;
  for (uint64_t entry : entries) present += (entry >> 63) & 1;
  return present;
}

}  // namespace reshard
