// A large buffer of anonymous memory that goes back to the kernel when it is destroyed.
//
// The Executor's window buffers are tens of MiB. From the heap, glibc may keep them in
// per-thread arenas after they are freed (its mmap threshold rises after large frees), so a
// daemon that runs many jobs on many threads would grow its resident memory job after job.
// Mapping them directly returns every byte at destruction.

#ifndef RESHARD_LIB_IO_PAGE_BUFFER_H_
#define RESHARD_LIB_IO_PAGE_BUFFER_H_

#include <cstddef>

namespace reshard {

class PageBuffer {
 public:
  PageBuffer() = default;
  // Maps `size` bytes (rounded up to pages); aborts when the kernel refuses, as new would.
  explicit PageBuffer(size_t size);
  PageBuffer(PageBuffer&& other) noexcept;
  PageBuffer& operator=(PageBuffer&& other) noexcept;
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  ~PageBuffer();

  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_size_ = 0;  // size_ rounded up to pages
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_PAGE_BUFFER_H_
