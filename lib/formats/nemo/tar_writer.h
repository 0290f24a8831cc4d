// Tar archives for tests and fixtures, laid out as Python's tarfile writes them: 512-byte
// headers, data padded to 512 bytes, two zero blocks at the end.
//
// testonly: nothing here is checked.

#ifndef RESHARD_LIB_FORMATS_NEMO_TAR_WRITER_H_
#define RESHARD_LIB_FORMATS_NEMO_TAR_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace reshard {
namespace tar_testing {

struct Member {
  std::string name;
  std::string data;
  char type = '0';  // '0' file, '5' folder, '2' symlink, '1' hard link
  std::string link;
  // How a name longer than 100 bytes is written: a GNU 'L' header, else a pax 'x' header.
  bool gnu_long_name = false;
};

// The archive, and where each member's data starts in it.
struct Built {
  std::string bytes;
  std::vector<uint64_t> data_offsets;
  std::vector<uint64_t> header_offsets;  // each member's first header (long-name one included)
};

Built BuildTar(const std::vector<Member>& members);

// One ustar header (checksum set): for tests that write headers of their own.
std::string TarHeader(const std::string& name, uint64_t size, char type,
                      const std::string& link = "");

}  // namespace tar_testing
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_NEMO_TAR_WRITER_H_
