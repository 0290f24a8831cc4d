#include "lib/formats/nemo/tar_writer.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace reshard {
namespace tar_testing {

namespace {

void Octal(std::string& header, size_t offset, size_t width, uint64_t value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%0*llo", static_cast<int>(width - 1),
                static_cast<unsigned long long>(value));
  std::memcpy(&header[offset], buffer, width - 1);
}

std::string Padded(const std::string& data) {
  std::string out = data;
  out.resize((data.size() + 511) / 512 * 512, '\0');
  return out;
}

}  // namespace

std::string TarHeader(const std::string& name, uint64_t size, char type, const std::string& link) {
  std::string header(512, '\0');
  std::memcpy(&header[0], name.data(), std::min<size_t>(name.size(), 100));
  Octal(header, 100, 8, 0644);
  Octal(header, 108, 8, 0);
  Octal(header, 116, 8, 0);
  Octal(header, 124, 12, size);
  Octal(header, 136, 12, 0);
  header[156] = type;
  std::memcpy(&header[157], link.data(), std::min<size_t>(link.size(), 100));
  std::memcpy(&header[257], "ustar\0" "00", 8);
  std::memset(&header[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : header) sum += c;
  char buffer[8];
  std::snprintf(buffer, sizeof(buffer), "%06o", sum);
  std::memcpy(&header[148], buffer, 7);  // six digits, NUL, then the space already there
  return header;
}

Built BuildTar(const std::vector<Member>& members) {
  Built built;
  for (const Member& member : members) {
    built.header_offsets.push_back(built.bytes.size());
    std::string name = member.name;
    if (name.size() > 100) {
      if (member.gnu_long_name) {
        const std::string long_name = name + '\0';
        built.bytes += TarHeader("././@LongLink", long_name.size(), 'L');
        built.bytes += Padded(long_name);
      } else {
        std::string record = absl::StrCat(" path=", name, "\n");
        // The length counts its own digits.
        size_t length = record.size() + 1;
        while (absl::StrCat(length).size() + record.size() != length) ++length;
        record = absl::StrCat(length, record);
        built.bytes += TarHeader("./PaxHeaders/x", record.size(), 'x');
        built.bytes += Padded(record);
      }
      name = name.substr(0, 100);
    }
    built.bytes += TarHeader(name, member.data.size(), member.type, member.link);
    built.data_offsets.push_back(built.bytes.size());
    built.bytes += Padded(member.data);
  }
  built.bytes += std::string(1024, '\0');
  return built;
}

}  // namespace tar_testing
}  // namespace reshard
