#include "lib/formats/nemo/tar_archive.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "lib/core/status.h"

namespace reshard {

namespace {

// Header fields (POSIX ustar; GNU tar uses the same offsets up to the magic).
constexpr size_t kNameOffset = 0;
constexpr size_t kNameSize = 100;
constexpr size_t kSizeOffset = 124;
constexpr size_t kSizeSize = 12;
constexpr size_t kChecksumOffset = 148;
constexpr size_t kChecksumSize = 8;
constexpr size_t kTypeOffset = 156;
constexpr size_t kLinkOffset = 157;
constexpr size_t kLinkSize = 100;
constexpr size_t kMagicOffset = 257;
constexpr size_t kPrefixOffset = 345;
constexpr size_t kPrefixSize = 155;

// A NUL-terminated field.
absl::string_view Field(absl::string_view header, size_t offset, size_t size) {
  absl::string_view field = header.substr(offset, size);
  const size_t end = field.find('\0');
  return end == absl::string_view::npos ? field : field.substr(0, end);
}

// An octal number field (leading spaces, digits, then NULs or spaces), or GNU's base-256 form
// (first byte 0x80, the rest big-endian). nullopt when malformed or past 2^63.
std::optional<uint64_t> ParseNumber(absl::string_view field) {
  const auto first = static_cast<unsigned char>(field.empty() ? 0 : field[0]);
  if (first & 0x80) {
    if (first != 0x80) return std::nullopt;  // negative (0xff) or unknown
    uint64_t value = 0;
    for (size_t i = 1; i < field.size(); ++i) {
      if (value >> 55) return std::nullopt;
      value = (value << 8) | static_cast<unsigned char>(field[i]);
    }
    return value;
  }
  size_t i = 0;
  while (i < field.size() && field[i] == ' ') ++i;
  uint64_t value = 0;
  for (; i < field.size() && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (value >> 60) return std::nullopt;
    value = value * 8 + static_cast<uint64_t>(field[i] - '0');
  }
  for (; i < field.size(); ++i) {
    if (field[i] != '\0' && field[i] != ' ') return std::nullopt;
  }
  return value;
}

bool IsZeroBlock(absl::string_view block) {
  for (char c : block) {
    if (c != '\0') return false;
  }
  return true;
}

// Whether the header's checksum field matches its bytes (the field counted as spaces), as an
// unsigned or (old tars) signed sum.
bool ChecksumMatches(absl::string_view header) {
  const std::optional<uint64_t> recorded =
      ParseNumber(header.substr(kChecksumOffset, kChecksumSize));
  if (!recorded.has_value()) return false;
  int64_t unsigned_sum = 0;
  int64_t signed_sum = 0;
  for (size_t i = 0; i < header.size(); ++i) {
    const bool in_field = i >= kChecksumOffset && i < kChecksumOffset + kChecksumSize;
    const char c = in_field ? ' ' : header[i];
    unsigned_sum += static_cast<unsigned char>(c);
    signed_sum += static_cast<signed char>(c);
  }
  return static_cast<int64_t>(*recorded) == unsigned_sum ||
         static_cast<int64_t>(*recorded) == signed_sum;
}

// What pax records ("LEN key=value\n" ...) set for the next member.
struct PaxOverrides {
  std::optional<std::string> path;
  std::optional<std::string> linkpath;
  std::optional<uint64_t> size;
};

absl::Status ParsePax(absl::string_view records, PaxOverrides& out, absl::string_view where) {
  while (!records.empty()) {
    const size_t space = records.find(' ');
    uint64_t length = 0;
    if (space == absl::string_view::npos ||
        !absl::SimpleAtoi(records.substr(0, space), &length) || length <= space + 1 ||
        length > records.size() || records[length - 1] != '\n') {
      return absl::DataLossError(absl::StrCat(where, ": malformed pax record"));
    }
    absl::string_view record = records.substr(space + 1, length - space - 2);
    records.remove_prefix(length);
    const size_t equals = record.find('=');
    if (equals == absl::string_view::npos) {
      return absl::DataLossError(absl::StrCat(where, ": pax record without '='"));
    }
    const absl::string_view key = record.substr(0, equals);
    const absl::string_view value = record.substr(equals + 1);
    if (key == "path") {
      out.path = std::string(value);
    } else if (key == "linkpath") {
      out.linkpath = std::string(value);
    } else if (key == "size") {
      uint64_t size = 0;
      if (!absl::SimpleAtoi(value, &size) || value.empty() || value[0] == '+' ||
          value[0] == '-') {
        return absl::DataLossError(
            absl::StrCat(where, ": pax size \"", value, "\" is not a number"));
      }
      out.size = size;
    }
  }
  return absl::OkStatus();
}

TarMember::Kind KindOf(char type) {
  switch (type) {
    case '0':
    case '\0':
    case '7':  // contiguous file
      return TarMember::Kind::kFile;
    case '5':
      return TarMember::Kind::kFolder;
    case '2':
      return TarMember::Kind::kSymlink;
    case '1':
      return TarMember::Kind::kHardlink;
    default:
      return TarMember::Kind::kOther;
  }
}

absl::string_view KindName(TarMember::Kind kind) {
  switch (kind) {
    case TarMember::Kind::kFile:
      return "a file";
    case TarMember::Kind::kFolder:
      return "a folder";
    case TarMember::Kind::kSymlink:
      return "a symbolic link";
    case TarMember::Kind::kHardlink:
      return "a hard link";
    case TarMember::Kind::kOther:
      break;
  }
  return "a special file";
}

// Reads headers through windows of kWindowBytes: the headers of small members (configs,
// tokenizer files) that follow each other cost a remote archive one range read, not one each.
class HeaderWindow {
 public:
  static constexpr uint64_t kWindowBytes = 64 << 10;

  explicit HeaderWindow(ByteSource& source) : source_(source) {}

  // [offset, offset + length) of the source, from the current window when it holds them.
  absl::StatusOr<absl::string_view> Read(uint64_t offset, uint64_t length,
                                         absl::string_view what) {
    if (offset < start_ || offset - start_ > bytes_.size() ||
        length > bytes_.size() - (offset - start_)) {
      const uint64_t size = source_.size();
      const uint64_t window =
          offset < size ? std::min(std::max(length, kWindowBytes), size - offset) : 0;
      if (window < length) return source_.Read(offset, length, what);  // reports the end
      ASSIGN_OR_RETURN(bytes_, source_.Read(offset, window, what));
      start_ = offset;
    }
    return bytes_.substr(offset - start_, length);
  }

 private:
  ByteSource& source_;
  uint64_t start_ = 0;
  absl::string_view bytes_;
};

}  // namespace

absl::StatusOr<std::string> NormalizeTarName(absl::string_view name) {
  if (absl::StartsWith(name, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("member \"", name, "\" is an absolute path, outside the archive"));
  }
  std::vector<absl::string_view> parts;
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("member \"", name, "\" leaves the archive (a \"..\" component)"));
    }
    parts.push_back(part);
  }
  return absl::StrJoin(parts, "/");
}

absl::StatusOr<TarArchive> TarArchive::Parse(ByteSource& source) {
  TarArchive archive;
  archive.path_ = source.path();
  archive.size_ = source.size();
  const std::string& path = archive.path_;
  const uint64_t size = archive.size_;

  std::optional<std::string> long_name;
  std::optional<std::string> long_link;
  PaxOverrides pax;
  std::optional<uint64_t> member_start;  // the first header of the member being read
  // The member before the current offset, for messages about what follows it.
  auto after = [&]() -> std::string {
    return archive.members_.empty()
               ? std::string(" (before any member)")
               : absl::StrCat(" (after member ", archive.members_.back().name, ")");
  };
  HeaderWindow window(source);
  uint64_t offset = 0;
  while (true) {
    if (offset >= size || size - offset < kBlock) {
      return absl::DataLossError(absl::StrCat(
          path, ": truncated archive: it ends at byte offset ", size,
          offset >= size ? absl::StrCat(" where a header or the end-of-archive block should be")
                         : absl::StrCat(" inside the header at byte offset ", offset),
          after()));
    }
    ASSIGN_OR_RETURN(const absl::string_view header, window.Read(offset, kBlock, "tar header"));
    if (IsZeroBlock(header)) {
      if (member_start.has_value()) {
        return absl::DataLossError(absl::StrCat(
            path, ": the long-name or pax header at byte offset ", *member_start,
            " is followed by the end of the archive, not by its member"));
      }
      break;
    }
    if (!member_start.has_value()) member_start = offset;
    const absl::string_view raw_name = Field(header, kNameOffset, kNameSize);
    const std::string where =
        absl::StrCat(path, ": header at byte offset ", offset, " (\"", raw_name, "\")");
    if (!ChecksumMatches(header)) {
      return absl::DataLossError(absl::StrCat(where, ": checksum mismatch (not a tar header)"));
    }
    const char type = header[kTypeOffset];
    std::optional<uint64_t> member_size = ParseNumber(header.substr(kSizeOffset, kSizeSize));
    if (!member_size.has_value()) {
      return absl::DataLossError(absl::StrCat(where, ": malformed size field"));
    }
    if (pax.size.has_value() && type != 'x' && type != 'g' && type != 'L' && type != 'K') {
      member_size = pax.size;
    }
    const uint64_t data_offset = offset + kBlock;
    if (*member_size > size - data_offset) {
      return absl::DataLossError(absl::StrCat(
          path, ": truncated archive: member ",
          pax.path.has_value() ? *pax.path : long_name.value_or(std::string(raw_name)),
          " (header at byte offset ",
          *member_start, ") has ", *member_size, " bytes from byte offset ", data_offset,
          " but the archive ends at byte offset ", size));
    }
    const uint64_t padded = (*member_size + kBlock - 1) / kBlock * kBlock;
    const uint64_t next = data_offset + padded;  // may pass the end; the loop says so

    if (type == 'L' || type == 'K' || type == 'x') {
      const uint64_t cap = type == 'x' ? kMaxPaxBytes : kMaxLongNameBytes;
      if (*member_size > cap) {
        return absl::ResourceExhaustedError(absl::StrCat(
            where, ": a ", type == 'x' ? "pax header" : "long name", " of ", *member_size,
            " bytes (at most ", cap, ")"));
      }
      ASSIGN_OR_RETURN(const absl::string_view data,
                       window.Read(data_offset, *member_size, "tar extended header"));
      if (type == 'x') {
        RETURN_IF_ERROR(ParsePax(data, pax, where));
      } else {
        const size_t end = data.find('\0');
        std::string text(end == absl::string_view::npos ? data : data.substr(0, end));
        (type == 'L' ? long_name : long_link) = std::move(text);
      }
      offset = next;
      continue;
    }
    if (type == 'g') {  // pax global header: nothing NeMo needs
      offset = next;
      member_start.reset();
      continue;
    }

    TarMember member;
    member.kind = KindOf(type);
    member.header_offset = *member_start;
    member.data_offset = data_offset;
    member.size = *member_size;
    std::string name;
    if (pax.path.has_value()) {
      name = *pax.path;
    } else if (long_name.has_value()) {
      name = *long_name;
    } else {
      name = std::string(raw_name);
      // POSIX ustar ("ustar\0" "00") splits long names into prefix/name.
      if (header.substr(kMagicOffset, 6) == absl::string_view("ustar\0", 6)) {
        const absl::string_view prefix = Field(header, kPrefixOffset, kPrefixSize);
        if (!prefix.empty()) name = absl::StrCat(prefix, "/", name);
      }
    }
    if (pax.linkpath.has_value()) {
      member.link_target = *pax.linkpath;
    } else if (long_link.has_value()) {
      member.link_target = *long_link;
    } else {
      member.link_target = std::string(Field(header, kLinkOffset, kLinkSize));
    }
    ASSIGN_OR_RETURN(member.name, NormalizeTarName(name),
                     absl::StrCat(path, ": header at byte offset ", offset));
    long_name.reset();
    long_link.reset();
    pax = PaxOverrides();
    member_start.reset();
    if (member.name.empty()) {
      if (member.kind != TarMember::Kind::kFolder) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": header at byte offset ", offset, ": member \"", name, "\" has no name"));
      }
      offset = next;  // the archive's own folder ("./")
      continue;
    }
    if (archive.members_.size() >= kMaxMembers) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": more than ", kMaxMembers, " members"));
    }
    auto [slot, inserted] = archive.by_name_.emplace(member.name, archive.members_.size());
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": member ", member.name, " appears twice (headers at byte offsets ",
          archive.members_[slot->second].header_offset, " and ", member.header_offset, ")"));
    }
    archive.members_.push_back(std::move(member));
    offset = next;
  }
  return archive;
}

const TarMember* TarArchive::Find(absl::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &members_[it->second];
}

absl::StatusOr<const TarMember*> TarArchive::File(absl::string_view name) const {
  const TarMember* member = Find(name);
  if (member == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no member ", name));
  }
  if (member->kind != TarMember::Kind::kFile) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(*member), " is ", KindName(member->kind),
        member->link_target.empty() ? "" : absl::StrCat(" to \"", member->link_target, "\""),
        ", not a file (links inside an archive are not followed)"));
  }
  return member;
}

std::string TarArchive::Describe(const TarMember& member) const {
  return absl::StrCat(path_, " member ", member.name);
}

}  // namespace reshard
