#include "server/job_store.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

v1::Job MakeJob(const std::string& id, double created, v1::JobState state) {
  v1::Job job;
  job.set_id(id);
  job.set_idempotency_key("key-" + id);
  job.set_state(state);
  job.set_created_unix(created);
  job.mutable_spec()->set_kind(v1::JOB_KIND_RESHARD);
  job.mutable_spec()->set_input("/data/in-" + id);
  job.mutable_spec()->set_output("/data/out-" + id);
  job.mutable_spec()->set_parts(4);
  job.mutable_spec()->set_rules_json(R"({"rules": []})");
  job.set_attempts(1);
  v1::OutputFile* file = job.add_committed_files();
  file->set_name("model-00001-of-00002.safetensors");
  file->set_bytes(1234);
  file->set_xxh3_64("0123456789abcdef");
  return job;
}

std::vector<std::string> Ids(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> ids;
  for (const v1::Job& job : jobs) ids.push_back(job.id());
  return ids;
}

bool Same(const v1::Job& a, const v1::Job& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

TEST(JobStoreTest, PutAndLoadAllRoundTripInCreationOrder) {
  const std::string dir = MakeTempDir("job_store") + "/state";  // created by Open
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE(fs::exists(dir + "/jobs.sqlite3"));
  auto empty = (*store)->LoadAll();
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());

  const v1::Job c = MakeJob("c", 300.5, v1::JOB_STATE_QUEUED);
  const v1::Job a = MakeJob("a", 100.25, v1::JOB_STATE_SUCCEEDED);
  const v1::Job b = MakeJob("b", 200.0, v1::JOB_STATE_RUNNING);
  ASSERT_TRUE((*store)->Put(c).ok());
  ASSERT_TRUE((*store)->Put(a).ok());
  ASSERT_TRUE((*store)->Put(b).ok());

  auto jobs = (*store)->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(Ids(*jobs), (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_EQ(jobs->size(), 3u);
  EXPECT_TRUE(Same((*jobs)[0], a)) << (*jobs)[0].DebugString();
  EXPECT_TRUE(Same((*jobs)[1], b)) << (*jobs)[1].DebugString();
  EXPECT_TRUE(Same((*jobs)[2], c)) << (*jobs)[2].DebugString();
}

TEST(JobStoreTest, PutReplacesAndDeleteRemoves) {
  const std::string dir = MakeTempDir("job_store");
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  v1::Job a = MakeJob("a", 1, v1::JOB_STATE_QUEUED);
  ASSERT_TRUE((*store)->Put(a).ok());
  ASSERT_TRUE((*store)->Put(MakeJob("b", 2, v1::JOB_STATE_QUEUED)).ok());

  a.set_state(v1::JOB_STATE_FAILED);
  a.mutable_error()->set_code(15);
  a.mutable_error()->set_message("boom");
  a.clear_committed_files();
  ASSERT_TRUE((*store)->Put(a).ok());
  auto jobs = (*store)->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(Ids(*jobs), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(Same((*jobs)[0], a)) << (*jobs)[0].DebugString();
  EXPECT_EQ((*jobs)[0].committed_files_size(), 0);

  ASSERT_TRUE((*store)->Delete("a").ok());
  EXPECT_TRUE((*store)->Delete("no-such-job").ok());
  jobs = (*store)->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(Ids(*jobs), (std::vector<std::string>{"b"}));
}

TEST(JobStoreTest, ReopenSeesTheData) {
  const std::string dir = MakeTempDir("job_store");
  const v1::Job a = MakeJob("a", 10, v1::JOB_STATE_RUNNING);
  const v1::Job b = MakeJob("b", 20, v1::JOB_STATE_CANCELLED);
  {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Put(a).ok());
    ASSERT_TRUE((*store)->Put(b).ok());
    ASSERT_TRUE((*store)->Put(MakeJob("gone", 30, v1::JOB_STATE_SUCCEEDED)).ok());
    ASSERT_TRUE((*store)->Delete("gone").ok());
  }
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadAll();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(Ids(*jobs), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(Same((*jobs)[0], a)) << (*jobs)[0].DebugString();
  EXPECT_TRUE(Same((*jobs)[1], b)) << (*jobs)[1].DebugString();
}

TEST(JobStoreTest, OpenFailsWhereNoFolderCanBeMade) {
  const std::string dir = MakeTempDir("job_store");
  EXPECT_FALSE(JobStore::Open(dir + "/missing/parent/state").ok());
}

// A folder of another user (a volume root owned by root, group the pod's fsGroup) cannot be
// made private by the daemon: it starts (with a warning), and the job store in it is 0600.
// Changing a folder's owner needs root.
TEST(JobStoreTest, OpenFolderOfAnotherUserKeepsItsModeAndAPrivateStore) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the folder to another user";
  const std::string dir = MakeTempDir("job_store") + "/state";
  ASSERT_EQ(::mkdir(dir.c_str(), 0775), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0775), 0);
  ASSERT_EQ(::chown(dir.c_str(), 65534, 0), 0);
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Put(MakeJob("a", 1, v1::JOB_STATE_QUEUED)).ok());
  struct stat st;
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0775u);
  for (const char* name : {"/jobs.sqlite3", "/jobs.sqlite3-wal", "/jobs.sqlite3-shm"}) {
    ASSERT_EQ(::stat((dir + name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 07777, 0600u) << name;
  }
}

}  // namespace
}  // namespace reshard
