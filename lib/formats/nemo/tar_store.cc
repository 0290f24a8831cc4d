#include "lib/formats/nemo/tar_store.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "lib/core/status.h"
#include "lib/io/byte_range.h"
#include "lib/io/kvstore/location.h"

namespace reshard {

namespace {

constexpr absl::string_view kPrefix = "tar://";

// The archives mounted now, by root. Several mounts of one archive (two jobs reading it) are
// all listed; any of them serves its paths.
class MountTable {
 public:
  void Add(const MountedTar* mount) {
    absl::MutexLock lock(&mu_);
    mounts_.emplace(mount->root(), mount);
  }
  void Remove(const MountedTar* mount) {
    absl::MutexLock lock(&mu_);
    auto [begin, end] = mounts_.equal_range(mount->root());
    for (auto it = begin; it != end; ++it) {
      if (it->second == mount) {
        mounts_.erase(it);
        return;
      }
    }
  }
  // The mount whose root `path` is or lies under (the longest such root), or NotFound naming
  // `path`. The mount stays alive while its owner reads through it.
  absl::StatusOr<const MountedTar*> Find(absl::string_view path) const {
    absl::MutexLock lock(&mu_);
    const MountedTar* found = nullptr;
    for (const auto& [root, mount] : mounts_) {
      if (!absl::StartsWith(path, root)) continue;
      if (path.size() > root.size() && path[root.size()] != '/') continue;
      if (found == nullptr || root.size() > found->root().size()) found = mount;
    }
    if (found == nullptr) {
      return absl::NotFoundError(
          absl::StrCat(path,
                       " does not exist: tar:// paths name members of an archive that a reader has "
                       "open (\"tar://<archive>!/<member>\"), and no reader has this one open"));
    }
    return found;
  }

 private:
  mutable absl::Mutex mu_;
  std::multimap<std::string, const MountedTar*> mounts_ ABSL_GUARDED_BY(mu_);
};

MountTable& Mounts() {
  static MountTable* const table = new MountTable();
  return *table;
}

// The folder holding `name` ("" for the root) and its last segment.
std::pair<std::string, std::string> SplitName(const std::string& name) {
  const size_t slash = name.rfind('/');
  if (slash == std::string::npos) return {"", name};
  return {name.substr(0, slash), name.substr(slash + 1)};
}

absl::Status ReadOnly(const std::string& path) {
  return absl::PermissionDeniedError(
      absl::StrCat(path, ": a member of a tar archive, which reshard only reads"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MountedTar>> MountedTar::Mount(const std::string& archive) {
  std::unique_ptr<MountedTar> mount(new MountedTar());
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(archive));
  mount->file_ = std::make_unique<MappedFile>(std::move(file));
  mount->file_->AdviseRandomAccess();  // headers spread over the whole archive
  mount->source_ = ByteSourceFor(*mount->file_);
  ASSIGN_OR_RETURN(mount->tar_, TarArchive::Parse(*mount->source_));
  mount->root_ = absl::StrCat(kPrefix, archive, "!");
  // Every member's folders, its own header or not; a file in its folder's listing.
  mount->folders_[""];
  for (const TarMember& member : mount->tar_.members()) {
    std::string name = member.name;
    if (member.kind == TarMember::Kind::kFolder) mount->folders_[name];
    bool leaf = true;
    while (!name.empty()) {
      auto [parent, base] = SplitName(name);
      kvstore::Listing& listing = mount->folders_[parent];
      if (leaf && member.kind != TarMember::Kind::kFolder) {
        if (member.kind == TarMember::Kind::kFile) {
          listing.files.push_back({base, member.size, mount->file_->version()});
        } else {
          listing.others.push_back(base);
        }
      } else if (listing.folders.empty() || listing.folders.back() != base) {
        listing.folders.push_back(base);
      }
      leaf = false;
      name = parent;
    }
  }
  for (auto& [name, listing] : mount->folders_) {
    std::sort(
        listing.files.begin(), listing.files.end(),
        [](const kvstore::FileEntry& a, const kvstore::FileEntry& b) { return a.name < b.name; });
    std::sort(listing.folders.begin(), listing.folders.end());
    listing.folders.erase(std::unique(listing.folders.begin(), listing.folders.end()),
                          listing.folders.end());
    std::sort(listing.others.begin(), listing.others.end());
  }
  // A remote archive's small members (configs, metadata, small data files) are loaded now, in
  // few requests, and served from memory: a reader's many small reads cost no request each.
  if (!mount->file_->mapped()) {
    std::vector<ByteRange> ranges;
    uint64_t total = 0;
    for (const TarMember& member : mount->tar_.members()) {
      if (member.kind != TarMember::Kind::kFile || member.size == 0 ||
          member.size > kMaxHeldMemberBytes || total + member.size > kMaxHeldBytes) {
        continue;
      }
      total += member.size;
      ranges.push_back({member.data_offset, member.size});
      mount->held_.insert(member.name);
    }
    RETURN_IF_ERROR(mount->source_->Prefetch(std::move(ranges)),
                    absl::StrCat(archive, ": its small members"));
  }
  // Metadata pages only were touched: give them back before anything is converted.
  mount->file_->Release(0, mount->file_->size());
  Mounts().Add(mount.get());
  return mount;
}

MountedTar::~MountedTar() { Mounts().Remove(this); }

std::string MountedTar::PathOf(absl::string_view name) const {
  return name.empty() ? root_ : absl::StrCat(root_, "/", name);
}

absl::StatusOr<std::string> MountedTar::MemberOf(absl::string_view path) const {
  if (!absl::StartsWith(path, root_) || (path.size() > root_.size() && path[root_.size()] != '/')) {
    return absl::NotFoundError(absl::StrCat(path, " is not in ", root_));
  }
  absl::string_view rest = path.substr(root_.size());
  absl::ConsumePrefix(&rest, "/");
  ASSIGN_OR_RETURN(std::string name, NormalizeTarName(rest),
                   absl::StrCat(path, ": member of ", tar_.path()));
  return name;
}

absl::StatusOr<kvstore::PathStat> MountedTar::Stat(const std::string& path,
                                                   const std::string& name) const {
  kvstore::PathStat stat;
  if (const TarMember* member = tar_.Find(name);
      member != nullptr && member->kind != TarMember::Kind::kFolder) {
    stat.size = member->size;
    stat.version = file_->version();
    stat.generation = absl::StrCat(file_->version(), ":", member->data_offset);
    switch (member->kind) {
      case TarMember::Kind::kFile:
        break;
      case TarMember::Kind::kSymlink:
        stat.special = absl::StrCat("a symbolic link to \"", member->link_target, "\" in ",
                                    tar_.path(), " (not followed)");
        break;
      case TarMember::Kind::kHardlink:
        stat.special = absl::StrCat("a hard link to \"", member->link_target, "\" in ", tar_.path(),
                                    " (not followed)");
        break;
      default:
        stat.special = absl::StrCat("a special member of ", tar_.path());
        break;
    }
    return stat;
  }
  if (folders_.count(name) > 0) {
    stat.is_folder = true;
    return stat;
  }
  return absl::NotFoundError(
      absl::StrCat(path, " does not exist: ", tar_.path(), " has no member ", name));
}

absl::StatusOr<kvstore::Listing> MountedTar::List(const std::string& path,
                                                  const std::string& name) const {
  auto it = folders_.find(name);
  if (it == folders_.end()) {
    return absl::NotFoundError(
        absl::StrCat(path, " is not a folder: ", tar_.path(), " has no folder ", name));
  }
  return it->second;
}

absl::Status MountedTar::ReadRange(const std::string& path, const std::string& name,
                                   uint64_t offset, absl::Span<char> out) const {
  ASSIGN_OR_RETURN(const TarMember* member, tar_.File(name));
  if (offset > member->size || out.size() > member->size - offset) {
    return absl::DataLossError(
        absl::StrCat(path, ": bytes [", offset, ", ",
                     static_cast<unsigned __int128>(offset) + out.size() > UINT64_MAX
                         ? std::string("beyond 2^64")
                         : absl::StrCat(offset + out.size()),
                     ") pass the end of ", tar_.Describe(*member), " (", member->size, " bytes)"));
  }
  if (held_.count(name) > 0) {
    ASSIGN_OR_RETURN(absl::string_view bytes,
                     source_->Read(member->data_offset + offset, out.size(), path));
    std::copy(bytes.begin(), bytes.end(), out.begin());
    return absl::OkStatus();
  }
  return Annotate(file_->ReadAt(member->data_offset + offset, out.size(),
                                reinterpret_cast<std::byte*>(out.data())),
                  absl::StrCat(path, " at byte offset ", offset));
}

absl::StatusOr<std::string> TarStore::ConfinedPath(const std::string& path,
                                                   bool /*must_exist*/) const {
  return absl::PermissionDeniedError(
      absl::StrCat(path,
                   ": tar:// paths name members of an archive a reader has open, not inputs or "
                   "outputs; give the archive's own path"));
}

absl::StatusOr<kvstore::PathStat> TarStore::Stat(const std::string& path) const {
  ASSIGN_OR_RETURN(const MountedTar* mount, Mounts().Find(path));
  ASSIGN_OR_RETURN(const std::string name, mount->MemberOf(path));
  return mount->Stat(path, name);
}

absl::StatusOr<kvstore::Listing> TarStore::List(const std::string& path) const {
  ASSIGN_OR_RETURN(const MountedTar* mount, Mounts().Find(path));
  ASSIGN_OR_RETURN(const std::string name, mount->MemberOf(path));
  return mount->List(path, name);
}

absl::Status TarStore::ReadRange(const std::string& path, uint64_t offset, absl::Span<char> out,
                                 const kvstore::PathStat& /*opened*/) const {
  // The archive's own reads check its version (MappedFile pins it).
  ASSIGN_OR_RETURN(const MountedTar* mount, Mounts().Find(path));
  ASSIGN_OR_RETURN(const std::string name, mount->MemberOf(path));
  return mount->ReadRange(path, name, offset, out);
}

absl::Status TarStore::CreateExclusive(const std::string& path, absl::string_view) const {
  return ReadOnly(path);
}

absl::StatusOr<std::unique_ptr<kvstore::Writer>> TarStore::Write(
    const std::string& path, const kvstore::WriteOptions&) const {
  return ReadOnly(path);
}

absl::Status TarStore::Delete(const std::string& path) const { return ReadOnly(path); }

namespace {
const kvstore::DriverRegistration<TarStore> register_tar;
}  // namespace

}  // namespace reshard
