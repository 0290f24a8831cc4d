#include "lib/formats/format.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "lib/core/status.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace {

struct Registry {
  absl::Mutex mu;
  std::vector<std::unique_ptr<InputFormat>> inputs ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<OutputFormat>> outputs ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;  // never destroyed: used from static initializers
  return *registry;
}

}  // namespace

absl::Status AddVerbatimCopy(const std::string& path, const std::string& output_name,
                             const Catalog& catalog, ArrangedOutput& arranged) {
  ASSIGN_OR_RETURN(const InputFileInfo info, StatInputFile(path));
  return AddVerbatimRangeCopy(path, 0, info.size, output_name, catalog, arranged);
}

absl::Status AddVerbatimRangeCopy(const std::string& path, uint64_t offset, uint64_t size,
                                  const std::string& output_name, const Catalog& catalog,
                                  ArrangedOutput& arranged) {
  ASSIGN_OR_RETURN(InputFileInfo info, StatInputFile(path));
  if (offset > info.size || size > info.size - offset) {
    return absl::DataLossError(absl::StrCat(path, ": ", output_name, " is ", size,
                                            " bytes from byte offset ", offset, ", but the file has ",
                                            info.size, " bytes"));
  }
  std::string version = std::move(info.version);
  const int file = static_cast<int>(arranged.extra_files.size());
  arranged.extra_files.push_back(SourceFile{path, info.size, {}, std::move(version)});
  CatalogTensor bytes;
  bytes.name = absl::StrCat("verbatim:", output_name);
  bytes.dtype = DType::kU8;
  bytes.shape = {static_cast<int64_t>(size)};
  if (size > 0) {
    AddFlatRangePieces(bytes, file, offset, 0, static_cast<int64_t>(size));
  }
  const int source = static_cast<int>(catalog.tensors.size() + arranged.extra_tensors.size());
  arranged.extra_tensors.push_back(std::move(bytes));
  OutputFileLayout out;
  out.name = output_name;
  out.verbatim = true;
  OutputTensor tensor;
  tensor.name = "bytes";
  tensor.source = source;
  tensor.region.origin = {0};
  tensor.region.extent = {static_cast<int64_t>(size)};
  tensor.dtype = DType::kU8;
  out.tensors.push_back(std::move(tensor));
  arranged.layout.files.push_back(std::move(out));
  return absl::OkStatus();
}

void RegisterInputFormat(std::unique_ptr<InputFormat> format) {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  registry.inputs.push_back(std::move(format));
}

void RegisterOutputFormat(std::unique_ptr<OutputFormat> format) {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  registry.outputs.push_back(std::move(format));
}

std::vector<std::string> InputFormatIds() {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  std::vector<std::string> ids;
  for (const auto& format : registry.inputs) ids.emplace_back(format->id());
  return ids;
}

std::vector<std::string> OutputFormatIds() {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  std::vector<std::string> ids;
  for (const auto& format : registry.outputs) ids.emplace_back(format->id());
  return ids;
}

absl::StatusOr<const InputFormat*> DetectInputFormat(const std::string& path) {
  // Before any probe opens it: FIFOs, sockets and devices are refused, not read.
  RETURN_IF_ERROR(CheckInputFileType(path));
  // Formats are registered at static initialization and never removed, so the pointers copied
  // under the lock stay valid while they are probed without it.
  std::vector<const InputFormat*> by_priority;
  {
    Registry& registry = GetRegistry();
    absl::MutexLock lock(&registry.mu);
    for (const auto& format : registry.inputs) by_priority.push_back(format.get());
  }
  std::stable_sort(by_priority.begin(), by_priority.end(),
                   [](const InputFormat* a, const InputFormat* b) {
                     return a->probe_priority() > b->probe_priority();
                   });
  std::vector<std::string> ids;
  for (const InputFormat* format : by_priority) {
    absl::StatusOr<bool> accepted = format->Probe(path);
    if (!accepted.ok()) {
      return Annotate(accepted.status(),
                      absl::StrCat("detecting the format of ", path, " (", format->id(), ")"));
    }
    if (*accepted) return format;
    ids.emplace_back(format->id());
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "input ", path, " is in no format reshard reads (known: ", absl::StrJoin(ids, ", "), ")"));
}

std::string DescribeInputModel(const InputModel& model, absl::string_view format_name,
                               absl::string_view parts_origin) {
  const absl::string_view format = format_name.empty() ? model.format : format_name;
  if (model.arrangement == "model-parallel-parts") {
    return absl::StrCat(format, ", ", model.parts.size(), parts_origin.empty() ? "" : " ",
                        parts_origin,
                        " model-parallel parts (every file holds a slice of every tensor)");
  }
  size_t files = 0;
  for (const Catalog& part : model.parts) files += part.files.size();
  if (model.arrangement == "sharded") {
    return absl::StrCat(format, ", one model in ", files, " shards");
  }
  return absl::StrCat(format, ", one file");
}

absl::StatusOr<const OutputFormat*> FindOutputFormat(absl::string_view id) {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  std::vector<std::string> ids;
  for (const auto& format : registry.outputs) {
    if (format->id() == id) return format.get();
    ids.emplace_back(format->id());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown output format \"", id, "\" (known: ", absl::StrJoin(ids, ", "), ")"));
}

}  // namespace reshard
