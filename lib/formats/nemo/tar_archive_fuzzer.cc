// libFuzzer target: the tar member parser must never crash, hang or read out of bounds; every
// member it accepts lies inside the input, has a normalized name inside the archive and a name
// of its own. The same input parsed by range reads (as for a remote archive) must agree.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/string_view.h"
#include "lib/formats/nemo/tar_archive.h"
#include "lib/io/byte_source.h"
#include "lib/testing/fuzz_sources.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  reshard::ViewByteSource view(bytes, "fuzz.nemo");
  auto archive = reshard::TarArchive::Parse(view);

  std::unique_ptr<reshard::RangeReadSource> source =
      reshard::SmallWindowRangeReads(data, size, "fuzz.nemo");
  auto ranged = reshard::TarArchive::Parse(*source);
  if (archive.ok() != ranged.ok()) std::abort();
  if (!archive.ok()) {
    if (archive.status() != ranged.status()) std::abort();
    return 0;
  }
  if (archive->members().size() != ranged->members().size()) std::abort();
  std::set<std::string> names;
  for (size_t i = 0; i < archive->members().size(); ++i) {
    const reshard::TarMember& member = archive->members()[i];
    if (member.data_offset != ranged->members()[i].data_offset) std::abort();
    if (member.data_offset > size || member.size > size - member.data_offset) std::abort();
    const absl::StatusOr<std::string> normalized = reshard::NormalizeTarName(member.name);
    if (member.name.empty() || !normalized.ok() || *normalized != member.name) std::abort();
    if (!names.insert(member.name).second) std::abort();
    if (archive->Find(member.name) != &member) std::abort();
    volatile uint8_t sink = 0;  // ASan reports any byte outside the input
    if (member.size > 0) {
      sink ^= data[member.data_offset];
      sink ^= data[member.data_offset + member.size - 1];
    }
  }
  return 0;
}
