#include "lib/testing/zip_builder.h"

#include <zlib.h>

#include <algorithm>

namespace reshard {
namespace zip_testing {
namespace {

void Put16(std::string& out, uint64_t v) {
  for (int i = 0; i < 2; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void Put32(std::string& out, uint64_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void Put64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint32_t Crc32Of(const Entry& e) {
  if (e.crc32.has_value()) return *e.crc32;
  return static_cast<uint32_t>(
      ::crc32_z(0, reinterpret_cast<const Bytef*>(e.data.data()), e.data.size()));
}

}  // namespace

Built BuildZip(const std::vector<Entry>& entries, const Options& options) {
  Built b;
  std::string& out = b.bytes;
  for (const Entry& e : entries) {
    b.local.push_back(out.size());
    Put32(out, 0x04034b50);
    Put16(out, 0);
    Put16(out, e.data.empty() ? 0x0800 : 0x0808);
    Put16(out, e.method);
    Put16(out, 0);  // time
    Put16(out, 0);  // date
    Put32(out, 0);  // crc (in the data descriptor)
    Put32(out, 0);
    Put32(out, 0);
    Put16(out, e.name.size());
    uint64_t pad = 0;
    if (options.fb_padding) {
      const uint64_t start = out.size() + 2 + e.name.size() + 4;
      pad = (options.alignment - start % options.alignment) % options.alignment;
      Put16(out, 4 + pad);
    } else {
      Put16(out, 0);
    }
    out += e.name;
    if (options.fb_padding) {
      out += "FB";
      Put16(out, pad);
      out += std::string(pad, 'Z');
    }
    b.payload.push_back(out.size());
    out += e.data;
    if (!e.data.empty()) {
      Put32(out, 0x08074b50);
      Put32(out, Crc32Of(e));
      Put32(out, e.data.size());
      Put32(out, e.data.size());
    }
  }
  b.cd_offset = out.size();
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    const uint64_t size = e.uncompressed_size == UINT64_MAX ? e.data.size() : e.uncompressed_size;
    b.central.push_back(out.size());
    Put32(out, 0x02014b50);
    Put16(out, 0);  // made by
    Put16(out, 0);  // needed
    Put16(out, e.data.empty() ? 0x0800 : 0x0808);
    Put16(out, e.method);
    Put16(out, 0);
    Put16(out, 0);
    Put32(out, Crc32Of(e));
    Put32(out, e.zip64_extra ? 0xFFFFFFFFu : e.data.size());
    Put32(out, e.zip64_extra ? 0xFFFFFFFFu : size);
    Put16(out, e.name.size());
    Put16(out, e.zip64_extra ? 4 + 24 : 0);
    Put16(out, 0);  // comment
    Put16(out, 0);  // disk
    Put16(out, 0);  // internal attributes
    Put32(out, 0);  // external attributes
    Put32(out, e.zip64_extra ? 0xFFFFFFFFu : b.local[i]);
    out += e.name;
    if (e.zip64_extra) {
      Put16(out, 0x0001);
      Put16(out, 24);
      Put64(out, size);
      Put64(out, e.data.size());
      Put64(out, b.local[i]);
    }
  }
  b.cd_size = out.size() - b.cd_offset;
  if (options.zip64_end) {
    b.zip64_end = out.size();
    Put32(out, 0x06064b50);
    Put64(out, 44);
    Put16(out, 0x031E);
    Put16(out, 0x002D);
    Put32(out, 0);
    Put32(out, 0);
    Put64(out, entries.size());
    Put64(out, entries.size());
    Put64(out, b.cd_size);
    Put64(out, b.cd_offset);
    b.locator = out.size();
    Put32(out, 0x07064b50);
    Put32(out, 0);
    Put64(out, b.zip64_end);
    Put32(out, 1);
  }
  b.eocd = out.size();
  Put32(out, 0x06054b50);
  Put16(out, 0);
  Put16(out, 0);
  Put16(out, std::min<uint64_t>(entries.size(), 0xFFFF));
  Put16(out, std::min<uint64_t>(entries.size(), 0xFFFF));
  Put32(out, std::min<uint64_t>(b.cd_size, 0xFFFFFFFFu));
  Put32(out, std::min<uint64_t>(b.cd_offset, 0xFFFFFFFFu));
  Put16(out, options.comment.size());
  out += options.comment;
  return b;
}

}  // namespace zip_testing
}  // namespace reshard
