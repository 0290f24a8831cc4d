#include "lib/io/page_buffer.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

namespace reshard {
namespace {

// Buffers of at least this size are backed by transparent huge pages where the kernel allows
// them (THP in "madvise" mode, Debian's default). The window buffers are read into by pread and
// pinned page by page for every direct-I/O write; with 2 MiB pages the kernel walks and pins
// 512 times fewer of them. Measured on a 2 GiB consolidation, paired with 4 KiB pages:
// safetensors input 0.80x wall, 0.68x CPU; torch.save input 0.90x wall, 0.96x CPU
// (docs/benchmarks.md, "Huge pages for the window").
constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t size, size_t to) { return (size + to - 1) / to * to; }

}  // namespace

PageBuffer::PageBuffer(size_t size) : size_(size) {
  if (size == 0) return;
  if (size < kHugePage) {
    mapped_size_ = size;
    void* address =
        ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (address == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<char*>(address);
    return;
  }
  // Huge pages need 2 MiB alignment: map one huge page more and trim both ends. Only the whole
  // huge pages of the buffer get the advice: a tail of a few KiB (a span's alignment slack)
  // stays in small pages instead of costing a whole 2 MiB page of resident memory.
  mapped_size_ = RoundUp(size, 4096);
  const size_t reserve = mapped_size_ + kHugePage;
  void* address =
      ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (address == MAP_FAILED) throw std::bad_alloc();
  char* const base = static_cast<char*>(address);
  char* const aligned =
      reinterpret_cast<char*>(RoundUp(reinterpret_cast<uintptr_t>(base), kHugePage));
  if (aligned > base) ::munmap(base, static_cast<size_t>(aligned - base));
  char* const end = aligned + mapped_size_;
  if (base + reserve > end) ::munmap(end, static_cast<size_t>(base + reserve - end));
  // Advice only: without THP the buffer is ordinary pages.
  ::madvise(aligned, size / kHugePage * kHugePage, MADV_HUGEPAGE);
  data_ = aligned;
}

PageBuffer::PageBuffer(PageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_size_(std::exchange(other.mapped_size_, 0)) {}

PageBuffer& PageBuffer::operator=(PageBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, mapped_size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_size_ = std::exchange(other.mapped_size_, 0);
  }
  return *this;
}

PageBuffer::~PageBuffer() {
  if (data_ != nullptr) ::munmap(data_, mapped_size_);
}

}  // namespace reshard
