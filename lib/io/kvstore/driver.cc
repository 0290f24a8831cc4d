#include "lib/io/kvstore/driver.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "lib/core/status.h"

namespace reshard {
namespace kvstore {

absl::StatusOr<std::string> Driver::ConfinedPath(const std::string& path,
                                                 bool /*must_exist*/) const {
  const size_t start = path.find("://");
  std::string confined = path;
  while (!confined.empty() && confined.back() == '/') confined.pop_back();
  const absl::string_view rest =
      start == std::string::npos ? absl::string_view(confined)
                                 : absl::string_view(confined).substr(start + 3);
  for (absl::string_view segment : absl::StrSplit(rest, '/')) {
    if (segment.empty() || segment == "." || segment == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          path, " has an empty, \".\" or \"..\" segment; a key is named by plain segments"));
    }
  }
  return confined;
}

absl::StatusOr<std::string> Driver::WriteFile(const std::string& path,
                                              absl::string_view bytes) const {
  WriteOptions options;
  options.size_hint = bytes.size();
  ASSIGN_OR_RETURN(std::unique_ptr<Writer> writer, Write(path, options));
  absl::Status appended = writer->Append(bytes);
  if (!appended.ok()) {
    writer->Abort();
    return appended;
  }
  return writer->Commit();
}

}  // namespace kvstore
}  // namespace reshard
