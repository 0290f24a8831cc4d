#include "lib/formats/safetensors/header.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>

#include "absl/base/internal/endian.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "lib/core/status.h"
#include "lib/io/file_access.h"
#include "lib/io/mapped_file.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using Json = nlohmann::json;

// Thrown from the parser callback to stop parsing with a message.
struct HeaderSchemaError {
  std::string message;
};

// The deepest a valid header nests: root object > tensor object > shape array > number.
constexpr int kMaxDepth = 3;

absl::StatusOr<uint64_t> NonNegativeInteger(const Json& value, absl::string_view what,
                                            absl::string_view tensor) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    return static_cast<uint64_t>(value.get<int64_t>());
  }
  return absl::DataLossError(
      absl::StrCat("tensor \"", tensor, "\": ", what, " must be a non-negative integer, got ",
                   value.dump(-1, ' ', false, Json::error_handler_t::replace)));
}

absl::StatusOr<SafetensorsTensorEntry> ParseEntry(const std::string& name, const Json& value) {
  auto bad = [&](absl::string_view message) {
    return absl::DataLossError(absl::StrCat("tensor \"", name, "\": ", message));
  };
  if (!value.is_object()) return bad("expected an object {dtype, shape, data_offsets}");
  SafetensorsTensorEntry entry;
  entry.name = name;
  auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) return bad("missing string \"dtype\"");
  auto parsed = DTypeFromName(dtype->get<std::string>());
  if (!parsed.has_value()) {
    return absl::UnimplementedError(absl::StrCat("tensor \"", name, "\": dtype \"",
                                                 dtype->get<std::string>(),
                                                 "\" is not supported by reshard"));
  }
  entry.dtype = *parsed;
  auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) return bad("missing array \"shape\"");
  if (shape->size() > 64) return bad("more than 64 dimensions");
  for (const Json& extent : *shape) {
    ASSIGN_OR_RETURN(uint64_t e, NonNegativeInteger(extent, "every shape entry", name));
    if (e > static_cast<uint64_t>(INT64_MAX)) return bad("shape entry out of range");
    entry.shape.push_back(static_cast<int64_t>(e));
  }
  auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2) {
    return bad("missing \"data_offsets\": [begin, end]");
  }
  ASSIGN_OR_RETURN(entry.begin, NonNegativeInteger((*offsets)[0], "data_offsets[0]", name));
  ASSIGN_OR_RETURN(entry.end, NonNegativeInteger((*offsets)[1], "data_offsets[1]", name));
  if (entry.end < entry.begin) {
    return bad(
        absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "] end before they begin"));
  }
  auto count = NumElements(entry.shape);
  unsigned __int128 bytes =
      count.ok() ? static_cast<unsigned __int128>(*count) * DTypeSize(entry.dtype) : 0;
  if (!count.ok() || bytes > UINT64_MAX) {
    return bad(absl::StrCat("shape ", ShapeToString(entry.shape), " overflows"));
  }
  if (static_cast<uint64_t>(bytes) != entry.end - entry.begin) {
    return bad(absl::StrCat("shape ", ShapeToString(entry.shape), " x ", DTypeName(entry.dtype),
                            " is ", static_cast<uint64_t>(bytes), " bytes but data_offsets [",
                            entry.begin, ", ", entry.end, "] span ", entry.end - entry.begin));
  }
  return entry;
}

}  // namespace

absl::StatusOr<uint64_t> ParseSafetensorsHeaderLength(absl::string_view prefix8,
                                                      uint64_t file_size) {
  if (file_size < 8 || prefix8.size() < 8) {
    return absl::DataLossError(absl::StrCat("file is ", file_size,
                                            " bytes, too short for the 8-byte header length; not a "
                                            "safetensors file or truncated"));
  }
  const uint64_t length = absl::little_endian::Load64(prefix8.data());
  if (length > kSafetensorsMaxHeaderBytes) {
    return absl::DataLossError(absl::StrCat("header length ", length, " at byte offset 0 exceeds ",
                                            "the safetensors limit of ", kSafetensorsMaxHeaderBytes,
                                            " bytes"));
  }
  if (8 + length > file_size) {
    return absl::DataLossError(absl::StrCat("header length ", length,
                                            " at byte offset 0 runs past the end of the file (",
                                            file_size, " bytes); the file is truncated"));
  }
  if (length < 2) {
    return absl::DataLossError(absl::StrCat("header length ", length, " is too short for JSON"));
  }
  return length;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeaderJson(absl::string_view json,
                                                             uint64_t file_size) {
  SafetensorsHeader header;
  header.header_length = json.size();
  header.data_start = 8 + json.size();
  // Rejects duplicate keys and deep nesting while parsing, before a DOM grows.
  std::vector<std::set<std::string>> keys(kMaxDepth + 2);
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > kMaxDepth)
      throw HeaderSchemaError{"header JSON nests deeper than the schema allows"};
    if (event == Json::parse_event_t::object_start) {
      keys[depth + 1].clear();
    } else if (event == Json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!keys[depth].insert(key).second) {
        throw HeaderSchemaError{absl::StrCat("duplicate key \"", key, "\" in header JSON")};
      }
    }
    return true;
  };
  Json document;
  try {
    document = Json::parse(json.begin(), json.end(), callback);
  } catch (const HeaderSchemaError& e) {
    return absl::DataLossError(e.message);
  } catch (const Json::parse_error& e) {
    return absl::DataLossError(absl::StrCat("header is not valid UTF-8 JSON (error at header byte ",
                                            e.byte, ", file byte offset ", 8 + e.byte,
                                            "): ", e.what()));
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!document.is_object()) return absl::DataLossError("header JSON is not an object");
  for (auto it = document.begin(); it != document.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return absl::DataLossError("__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return absl::DataLossError(
              absl::StrCat("__metadata__ value of \"", m.key(), "\" is not a string: ",
                           m.value().dump(-1, ' ', false, Json::error_handler_t::replace)));
        }
        header.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(SafetensorsTensorEntry entry, ParseEntry(it.key(), it.value()));
    header.tensors.push_back(std::move(entry));
  }
  std::stable_sort(header.tensors.begin(), header.tensors.end(),
                   [](const SafetensorsTensorEntry& a, const SafetensorsTensorEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  uint64_t expected_begin = 0;
  for (const SafetensorsTensorEntry& entry : header.tensors) {
    if (entry.begin != expected_begin) {
      return absl::DataLossError(absl::StrCat(
          "tensor \"", entry.name, "\": data_offsets [", entry.begin, ", ", entry.end, "] ",
          entry.begin < expected_begin ? "overlap the previous tensor"
                                       : "leave a gap after the previous tensor",
          ", which ends at ", expected_begin, " (file byte offset ",
          header.data_start + expected_begin, ")"));
    }
    expected_begin = entry.end;
  }
  if (header.data_start + expected_begin != file_size) {
    return absl::DataLossError(absl::StrCat(
        "tensor data ends at file byte offset ", header.data_start + expected_begin,
        " but the file is ", file_size, " bytes",
        header.data_start + expected_begin < file_size ? " (trailing bytes after the last tensor)"
                                                       : " (the file is truncated)"));
  }
  return header;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view file_prefix,
                                                         uint64_t file_size) {
  ASSIGN_OR_RETURN(uint64_t length, ParseSafetensorsHeaderLength(file_prefix, file_size));
  if (file_prefix.size() < 8 + length) {
    return absl::DataLossError("header is not complete in the bytes given");
  }
  return ParseSafetensorsHeaderJson(file_prefix.substr(8, length), file_size);
}

namespace {

// The first read of a remote file's header: most headers fit (a 7B model's shard has about
// 30 KiB), so one range read usually fetches all of it.
constexpr uint64_t kRemoteHeaderProbeBytes = 256 << 10;

// ReadSafetensorsHeader of a file whose reads are requests (s3://, mem://): its size from the
// driver, then kRemoteHeaderProbeBytes, then the rest of the header when it is longer. The
// length prefix is validated (at most kSafetensorsMaxHeaderBytes, inside the object) before anything
// is allocated for it.
absl::StatusOr<SafetensorsHeader> ReadRemoteSafetensorsHeader(const std::string& path,
                                                              uint64_t* file_size,
                                                              std::string* version) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  *file_size = file.size();
  if (version != nullptr) *version = file.version();
  std::string prefix(static_cast<size_t>(std::min(file.size(), kRemoteHeaderProbeBytes)), '\0');
  RETURN_IF_ERROR(file.ReadAt(0, prefix.size(), reinterpret_cast<std::byte*>(prefix.data())));
  ASSIGN_OR_RETURN(const uint64_t length, ParseSafetensorsHeaderLength(prefix, file.size()), path);
  if (8 + length > prefix.size()) {
    const size_t have = prefix.size();
    prefix.resize(static_cast<size_t>(8 + length));
    RETURN_IF_ERROR(file.ReadAt(have, prefix.size() - have,
                                reinterpret_cast<std::byte*>(prefix.data() + have)));
  }
  ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeader(prefix, file.size()), path);
  return header;
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path,
                                                        uint64_t* file_size,
                                                        std::string* version) {
  if (InputReadsAreRequests(path)) return ReadRemoteSafetensorsHeader(path, file_size, version);
  if (version != nullptr) version->clear();
  ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISREG(st.st_mode))
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  *file_size = static_cast<uint64_t>(st.st_size);
  auto read_exact = [&](uint64_t offset, uint64_t length, std::string& out) -> absl::Status {
    out.resize(length);
    uint64_t done = 0;
    while (done < length) {
      ssize_t n = ::pread(fd, out.data() + done, length - done, offset + done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        return ErrnoToStatus(errno,
                             absl::StrCat("reading ", path, " at byte offset ", offset + done));
      if (n == 0)
        return absl::DataLossError(
            absl::StrCat(path, ": unexpected end of file at byte offset ", offset + done));
      done += static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  };
  std::string prefix;
  RETURN_IF_ERROR(read_exact(0, std::min<uint64_t>(8, *file_size), prefix));
  ASSIGN_OR_RETURN(const uint64_t length, ParseSafetensorsHeaderLength(prefix, *file_size), path);
  std::string json;
  RETURN_IF_ERROR(read_exact(8, length, json));
  ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeaderJson(json, *file_size), path);
  return header;
}

}  // namespace reshard
