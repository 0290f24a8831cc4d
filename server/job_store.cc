#include "server/job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <iostream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/core/status.h"

namespace reshard {
namespace {

absl::Status SqliteError(sqlite3* db, absl::string_view what) {
  return absl::InternalError(absl::StrCat("job store: ", what, ": ", sqlite3_errmsg(db)));
}

// Finalizes a statement on scope exit.
struct Statement {
  sqlite3_stmt* stmt = nullptr;
  ~Statement() { sqlite3_finalize(stmt); }
};

// The job records name every tenant's paths and token names: only the daemon's user may list
// the state folder. A folder of the daemon's user that others may enter is made private (made
// by hand, or by an older reshardd). One of another user (a volume root that Kubernetes gives
// the pod's fsGroup) cannot be changed: the daemon warns and starts, since the files it keeps
// there are 0600 and 0700 themselves.
absl::Status MakePrivateFolder(const std::string& folder) {
  if (::mkdir(folder.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("creating the state folder ", folder));
  }
  struct stat st;
  if (::stat(folder.c_str(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("reading the state folder ", folder));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the state folder ", folder, " is not a folder"));
  }
  const mode_t mode = st.st_mode & 07777;
  if ((mode & 077) == 0) return absl::OkStatus();
  if (st.st_uid != ::geteuid()) {
    std::cerr << absl::StrFormat(
        "reshardd: warning: the state folder %s has mode %04o and belongs to uid %d, not to "
        "reshardd's uid %d: other users may list it (the job store in it is 0600); chown it "
        "to uid %d and reshardd makes it 0700\n",
        folder, mode, st.st_uid, ::geteuid(), ::geteuid());
    return absl::OkStatus();
  }
  if (::chmod(folder.c_str(), 0700) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("making the state folder ", folder, " private"));
  }
  std::cerr << absl::StrFormat("reshardd: made the state folder %s private (mode %04o -> 0700)\n",
                               folder, mode);
  return absl::OkStatus();
}

// Makes the database and its WAL files 0600. SQLite creates a new database 0644 whatever the
// umask (it fchmods new files to its default mode) and gives -wal and -shm the mode of the
// database file, so the database is created here first, 0600, and files an older reshardd
// left 0644 are tightened.
absl::Status MakePrivateDatabase(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("creating the job store ", path));
  const bool made_private = ::fchmod(fd, 0600) == 0;
  const int error = errno;
  ::close(fd);
  if (!made_private) {
    return ErrnoToStatus(error, absl::StrCat("making the job store ", path, " private"));
  }
  for (const char* suffix : {"-wal", "-shm"}) {
    const std::string file = path + suffix;
    if (::chmod(file.c_str(), 0600) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, absl::StrCat("making ", file, " private"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& state_dir) {
  RETURN_IF_ERROR(MakePrivateFolder(state_dir));
  const std::string path = absl::StrCat(state_dir, "/jobs.sqlite3");
  RETURN_IF_ERROR(MakePrivateDatabase(path));
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    absl::Status status = SqliteError(db, absl::StrCat("opening ", path));
    sqlite3_close(db);
    return status;
  }
  std::unique_ptr<JobStore> store(new JobStore(db));
  absl::MutexLock lock(&store->mu_);
  RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL"));
  RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=FULL"));
  RETURN_IF_ERROR(
      store->Exec("CREATE TABLE IF NOT EXISTS jobs ("
                  "  id TEXT PRIMARY KEY,"
                  "  idempotency_key TEXT NOT NULL,"
                  "  state INTEGER NOT NULL,"
                  "  created REAL NOT NULL,"
                  "  job BLOB NOT NULL)"));
  return store;
}

JobStore::~JobStore() {
  absl::MutexLock lock(&mu_);
  sqlite3_close(db_);
}

absl::Status JobStore::Exec(const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    absl::Status status =
        absl::InternalError(absl::StrCat("job store: ", sql, ": ", error ? error : "?"));
    sqlite3_free(error);
    return status;
  }
  return absl::OkStatus();
}

absl::Status JobStore::Put(const v1::Job& job) {
  if (put_hook_) put_hook_(job);
  const std::string blob = job.SerializeAsString();
  absl::MutexLock lock(&mu_);
  Statement s;
  if (sqlite3_prepare_v2(db_,
                         "INSERT OR REPLACE INTO jobs (id, idempotency_key, state, created, job) "
                         "VALUES (?, ?, ?, ?, ?)",
                         -1, &s.stmt, nullptr) != SQLITE_OK) {
    return SqliteError(db_, "preparing insert");
  }
  sqlite3_bind_text(s.stmt, 1, job.id().data(), job.id().size(), SQLITE_TRANSIENT);
  sqlite3_bind_text(s.stmt, 2, job.idempotency_key().data(), job.idempotency_key().size(),
                    SQLITE_TRANSIENT);
  sqlite3_bind_int(s.stmt, 3, job.state());
  sqlite3_bind_double(s.stmt, 4, job.created_unix());
  sqlite3_bind_blob(s.stmt, 5, blob.data(), blob.size(), SQLITE_TRANSIENT);
  if (sqlite3_step(s.stmt) != SQLITE_DONE) {
    return SqliteError(db_, absl::StrCat("saving job ", job.id()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Job>> JobStore::LoadAll() {
  absl::MutexLock lock(&mu_);
  Statement s;
  if (sqlite3_prepare_v2(db_, "SELECT id, job FROM jobs ORDER BY created", -1, &s.stmt, nullptr) !=
      SQLITE_OK) {
    return SqliteError(db_, "preparing load");
  }
  std::vector<v1::Job> jobs;
  int rc;
  while ((rc = sqlite3_step(s.stmt)) == SQLITE_ROW) {
    v1::Job job;
    const void* blob = sqlite3_column_blob(s.stmt, 1);
    const int size = sqlite3_column_bytes(s.stmt, 1);
    if (!job.ParseFromArray(blob, size)) {
      return absl::DataLossError(absl::StrCat(
          "job store: job ", reinterpret_cast<const char*>(sqlite3_column_text(s.stmt, 0)),
          " is corrupt"));
    }
    jobs.push_back(std::move(job));
  }
  if (rc != SQLITE_DONE) return SqliteError(db_, "loading jobs");
  return jobs;
}

absl::Status JobStore::Delete(const std::string& id) {
  absl::MutexLock lock(&mu_);
  Statement s;
  if (sqlite3_prepare_v2(db_, "DELETE FROM jobs WHERE id = ?", -1, &s.stmt, nullptr) != SQLITE_OK) {
    return SqliteError(db_, "preparing delete");
  }
  sqlite3_bind_text(s.stmt, 1, id.data(), id.size(), SQLITE_TRANSIENT);
  if (sqlite3_step(s.stmt) != SQLITE_DONE)
    return SqliteError(db_, absl::StrCat("deleting job ", id));
  return absl::OkStatus();
}

}  // namespace reshard
