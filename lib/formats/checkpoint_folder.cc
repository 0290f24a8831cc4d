#include "lib/formats/checkpoint_folder.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/io/file_access.h"

namespace reshard {

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  return absl::StrCat(dir, dir.empty() || dir.back() == '/' ? "" : "/", name);
}

std::string BaseName(absl::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  const size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos) return std::string(path);
  return std::string(path.substr(slash + 1));
}

bool IsPlainPathComponent(absl::string_view name) {
  return !name.empty() && name.size() <= kMaxPathComponentBytes && name != "." && name != ".." &&
         name.find_first_of(absl::string_view("/\0", 2)) == absl::string_view::npos;
}

bool IsPlainTag(absl::string_view tag) {
  return IsPlainPathComponent(tag) && !absl::StrContains(tag, "..");
}

absl::Status CheckTag(absl::string_view tag, absl::string_view source) {
  if (IsPlainTag(tag)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("tag \"", absl::CHexEscape(tag), "\" (", source,
                                                 ") is not a plain folder name"));
}

absl::StatusOr<std::optional<std::string>> ReadTrackerFile(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadSmallFile(path, kMaxTrackerFileBytes);
  if (absl::IsNotFound(contents.status())) return std::nullopt;
  // PERMISSION_DENIED, UNAVAILABLE (a store's 503), ...: the file is not at fault.
  if (!contents.ok() && !absl::IsInvalidArgument(contents.status())) return contents.status();
  if (!contents.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": not a readable tracker file (at most ",
                                            kMaxTrackerFileBytes,
                                            " bytes): ", contents.status().message()));
  }
  return std::string(absl::StripAsciiWhitespace(*contents));
}

void AppendCatalog(Catalog& target, Catalog source) {
  const int base = static_cast<int>(target.files.size());
  for (SourceFile& file : source.files) target.files.push_back(std::move(file));
  for (CatalogTensor& tensor : source.tensors) {
    for (SourcePiece& piece : tensor.pieces) piece.file += base;
    target.tensors.push_back(std::move(tensor));
  }
  for (auto& [key, value] : source.metadata) target.metadata.emplace(key, value);
  for (std::string& entry : source.other_entries) target.other_entries.push_back(std::move(entry));
}

}  // namespace reshard
