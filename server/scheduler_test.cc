#include "server/scheduler.h"

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lib/testing/test_files.h"
#include "prometheus/metric_family.h"
#include "server/job_store.h"
#include "server/metrics.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kWait = absl::Seconds(20);  // bound of every wait in these tests

double NowUnix() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

// Jobs are told apart by their spec's input ("name"). The memory estimator reads the
// reservation from max_shard_size so that each test sets it per job.
v1::JobSpec Spec(const std::string& name, int priority = 0, uint64_t memory = 10) {
  v1::JobSpec spec;
  spec.set_kind(v1::JOB_KIND_CONSOLIDATE);
  spec.set_input(name);
  spec.set_output("/out/" + name);
  spec.set_priority(priority);
  spec.set_max_shard_size(memory);
  return spec;
}

uint64_t Estimate(const v1::JobSpec& spec) { return spec.max_shard_size(); }

// A JobRunner the test controls. A run records itself, then blocks until the test releases
// it (or everything), or until the job is cancelled; then it returns the configured outcome.
class FakeRunner {
 public:
  struct Call {
    std::string id;
    bool resume = false;
    int attempts = 0;
    bool saw_cancelled = false;
    bool saw_preserve_staging = false;
    bool finished = false;
  };

  JobRunner AsRunner() {
    return [this](const v1::Job& job, JobContext& context) { return Run(job, context); };
  }

  void Release(const std::string& name) {
    absl::MutexLock lock(&mu_);
    released_.insert(name);
  }
  void ReleaseAll() {
    absl::MutexLock lock(&mu_);
    release_all_ = true;
  }
  // The named job notices cancellation only once released (a long window in the engine).
  void Stubborn(const std::string& name) {
    absl::MutexLock lock(&mu_);
    stubborn_.insert(name);
  }
  void FailWith(const std::string& name, absl::Status status) {
    absl::MutexLock lock(&mu_);
    failures_[name] = std::move(status);
  }

  // Waits until the named job has started (`count` times).
  bool WaitStarted(const std::string& name, int count = 1) {
    absl::MutexLock lock(&mu_);
    auto started = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return std::count(order_.begin(), order_.end(), name) >= count;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&started), kWait);
  }
  bool WaitFinishedRuns(int count) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return finished_runs_ >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), kWait);
  }

  // Calls the running job's progress callback from the test thread.
  void ReportProgress(const std::string& name, const Progress& progress) {
    JobContext* context = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = running_contexts_.find(name);
      ASSERT_NE(it, running_contexts_.end()) << name << " is not running";
      context = it->second;
    }
    context->on_progress(progress);
  }

  std::vector<std::string> order() {
    absl::MutexLock lock(&mu_);
    return order_;
  }
  bool Ran(const std::string& name) {
    absl::MutexLock lock(&mu_);
    return calls_.count(name) > 0;
  }
  Call LastCall(const std::string& name) {
    absl::MutexLock lock(&mu_);
    return calls_[name];
  }
  uint64_t max_reserved() {
    absl::MutexLock lock(&mu_);
    return max_reserved_;
  }
  int max_running() {
    absl::MutexLock lock(&mu_);
    return max_running_;
  }

 private:
  absl::StatusOr<ConversionResult> Run(const v1::Job& job, JobContext& context) {
    const std::string name = job.spec().input();
    {
      absl::MutexLock lock(&mu_);
      order_.push_back(name);
      Call& call = calls_[name];
      call = Call();
      call.id = job.id();
      call.resume = context.resume;
      call.attempts = job.attempts();
      running_contexts_[name] = &context;
      reserved_ += job.reserved_memory_bytes();
      max_reserved_ = std::max(max_reserved_, reserved_);
      ++running_;
      max_running_ = std::max(max_running_, running_);
    }
    // Wait for release or cancellation; `cancelled` is an atomic the scheduler sets under its
    // own mutex, so poll it.
    const absl::Time deadline = absl::Now() + kWait;
    bool cancelled = false;
    absl::MutexLock lock(&mu_);
    while (true) {
      const bool stubborn = stubborn_.count(name) > 0;
      if (!stubborn && context.cancelled.load()) {
        cancelled = true;
        break;
      }
      if (release_all_ || released_.count(name) > 0) {
        cancelled = stubborn && context.cancelled.load();
        break;
      }
      if (absl::Now() > deadline) break;  // the test fails on its own waits
      mu_.AwaitWithTimeout(
          absl::Condition(
              +[](FakeRunner* r) ABSL_NO_THREAD_SAFETY_ANALYSIS { return r->release_all_; }, this),
          absl::Milliseconds(2));
    }
    Call& call = calls_[name];
    call.saw_cancelled = cancelled;
    call.saw_preserve_staging = context.preserve_staging.load();
    call.finished = true;
    running_contexts_.erase(name);
    reserved_ -= job.reserved_memory_bytes();
    --running_;
    ++finished_runs_;
    if (cancelled) return absl::CancelledError("stopped at the next window");
    auto failure = failures_.find(name);
    if (failure != failures_.end()) return failure->second;
    ConversionResult result;
    result.output = job.spec().output();
    result.files.push_back({"model.safetensors", 8, 0xabcdef, 1});
    result.tensors = 1;
    result.bytes_read = 100;
    result.bytes_written = 108;
    result.plan_seconds = 0.5;
    result.data_files_seconds = 1.5;
    result.publish_seconds = 0.25;
    return result;
  }

  absl::Mutex mu_;
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Call> calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobContext*> running_contexts_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> released_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> stubborn_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status> failures_ ABSL_GUARDED_BY(mu_);
  bool release_all_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t max_reserved_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int max_running_ ABSL_GUARDED_BY(mu_) = 0;
  int finished_runs_ ABSL_GUARDED_BY(mu_) = 0;
};

class SchedulerTest : public testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = MakeTempDir("scheduler");
    auto store = JobStore::Open(state_dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    options_.memory_budget = 100;
    options_.max_concurrent_jobs = 1;
    options_.max_queue = 100;
    options_.max_attempts = 3;
  }

  void TearDown() override {
    runner_.ReleaseAll();
    if (scheduler_ != nullptr) scheduler_->Shutdown(absl::ZeroDuration());
    scheduler_.reset();
  }

  void StartScheduler() {
    scheduler_ = std::make_unique<Scheduler>(options_, store_.get(), &metrics_, runner_.AsRunner(),
                                             Estimate);
    ASSERT_TRUE(scheduler_->Start().ok());
  }

  v1::Job MustSubmit(const v1::JobSpec& spec, const std::string& key = "") {
    auto job = scheduler_->Submit(spec, key);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  // Waits (bounded) until `done` holds for the job and returns it.
  v1::Job WaitUntil(const std::string& id, const std::function<bool(const v1::Job&)>& done) {
    const absl::Time deadline = absl::Now() + kWait;
    int64_t version = -1;
    while (absl::Now() < deadline) {
      auto job = scheduler_->WaitForChange(id, &version, absl::Seconds(1));
      EXPECT_TRUE(job.ok()) << job.status();
      if (!job.ok()) return v1::Job();
      if (done(*job)) return *job;
    }
    ADD_FAILURE() << "job " << id << " did not reach the expected state in time";
    return v1::Job();
  }

  // Waits (bounded) until the job is in a terminal state and returns it.
  v1::Job WaitTerminal(const std::string& id) {
    return WaitUntil(id, [](const v1::Job& job) { return IsTerminal(job.state()); });
  }

  // Polls `done` until it holds (true) or kWait passes (false).
  static bool WaitFor(const std::function<bool()>& done) {
    const absl::Time deadline = absl::Now() + kWait;
    while (!done()) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return true;
  }

  // Waits (bounded) until a WaitForChange call waits on job `id`.
  bool WaitForWaiter(const std::string& id) {
    return WaitFor([&] { return scheduler_->WaitersForTesting(id) > 0; });
  }

  // Waits (bounded) until Shutdown or StopAccepting has begun.
  bool WaitStopAccepting() {
    return WaitFor([&] { return !scheduler_->accepting(); });
  }

  v1::Job StoredJob(const std::string& id) {
    auto jobs = store_->LoadAll();
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    if (jobs.ok()) {
      for (const v1::Job& job : *jobs) {
        if (job.id() == id) return job;
      }
    }
    ADD_FAILURE() << "job " << id << " is not in the store";
    return v1::Job();
  }

  // A counter's or gauge's value, or a histogram's sample count; -1 when absent.
  double MetricValue(const std::string& name,
                     const std::map<std::string, std::string>& labels = {}) {
    for (const prometheus::MetricFamily& family : metrics_.registry()->Collect()) {
      if (family.name != name) continue;
      for (const prometheus::ClientMetric& metric : family.metric) {
        std::map<std::string, std::string> found;
        for (const auto& label : metric.label) found[label.name] = label.value;
        if (found != labels) continue;
        switch (family.type) {
          case prometheus::MetricType::Counter:
            return metric.counter.value;
          case prometheus::MetricType::Gauge:
            return metric.gauge.value;
          case prometheus::MetricType::Histogram:
            return static_cast<double>(metric.histogram.sample_count);
          default:
            return -1;
        }
      }
    }
    return -1;
  }

  std::string state_dir_;
  std::unique_ptr<JobStore> store_;
  Metrics metrics_;
  SchedulerOptions options_;
  FakeRunner runner_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SchedulerTest, RunsByPriorityThenFifo) {
  StartScheduler();
  // The blocker occupies the only worker while the others queue up.
  const v1::Job blocker = MustSubmit(Spec("blocker"));
  ASSERT_TRUE(runner_.WaitStarted("blocker"));
  std::vector<std::string> ids;
  for (const auto& [name, priority] : std::vector<std::pair<std::string, int>>{
           {"a0", 0}, {"b5", 5}, {"c0", 0}, {"d5", 5}, {"e-1", -1}, {"f100", 100}}) {
    ids.push_back(MustSubmit(Spec(name, priority)).id());
  }
  for (const std::string& id : ids) {
    EXPECT_EQ(scheduler_->Get(id)->state(), v1::JOB_STATE_QUEUED);
  }
  runner_.ReleaseAll();
  for (const std::string& id : ids) {
    EXPECT_EQ(WaitTerminal(id).state(), v1::JOB_STATE_SUCCEEDED);
  }
  EXPECT_EQ(runner_.order(),
            (std::vector<std::string>{"blocker", "f100", "b5", "d5", "a0", "c0", "e-1"}));
  EXPECT_EQ(runner_.max_running(), 1);
}

TEST_F(SchedulerTest, SucceededJobCarriesTheResult) {
  StartScheduler();
  runner_.ReleaseAll();
  const v1::Job submitted = MustSubmit(Spec("one", 0, 42));
  EXPECT_EQ(submitted.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(submitted.reserved_memory_bytes(), 42u);
  EXPECT_GT(submitted.created_unix(), 0);
  const v1::Job done = WaitTerminal(submitted.id());
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.attempts(), 1);
  EXPECT_EQ(done.bytes_read(), 100u);
  EXPECT_EQ(done.bytes_written(), 108u);
  EXPECT_DOUBLE_EQ(done.timings().write_seconds(), 1.5);
  ASSERT_EQ(done.output_files_size(), 1);
  EXPECT_EQ(done.output_files(0).name(), "model.safetensors");
  EXPECT_EQ(done.output_files(0).xxh3_64(), "0000000000abcdef");
  EXPECT_GE(done.finished_unix(), done.started_unix());
  EXPECT_GE(done.started_unix(), done.created_unix());
  EXPECT_FALSE(done.has_error());
  EXPECT_EQ(StoredJob(submitted.id()).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(scheduler_->reserved_bytes(), 0u);
}

TEST_F(SchedulerTest, JobLargerThanTheBudgetIsRefusedAtSubmit) {
  StartScheduler();
  auto job = scheduler_->Submit(Spec("huge", 0, 101), "");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kResourceExhausted) << job.status();
  // spec.memory_budget counts too: max(memory_budget, estimate).
  v1::JobSpec spec = Spec("asks-for-more", 0, 10);
  spec.set_memory_budget(500);
  EXPECT_EQ(scheduler_->Submit(spec, "").status().code(), absl::StatusCode::kResourceExhausted);
  // Exactly the budget fits.
  runner_.ReleaseAll();
  const v1::Job fits = MustSubmit(Spec("fits", 0, 100));
  EXPECT_EQ(WaitTerminal(fits.id()).state(), v1::JOB_STATE_SUCCEEDED);
  auto page = scheduler_->List({}, 0, "");
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->jobs.size(), 1u) << "refused jobs must not be recorded";
}

TEST_F(SchedulerTest, ReservationsNeverExceedTheBudget) {
  options_.max_concurrent_jobs = 2;
  StartScheduler();
  // Two small jobs run together (so the fake can see concurrency at all)...
  MustSubmit(Spec("small1", 0, 40));
  MustSubmit(Spec("small2", 0, 40));
  ASSERT_TRUE(runner_.WaitStarted("small1"));
  ASSERT_TRUE(runner_.WaitStarted("small2"));
  EXPECT_EQ(runner_.max_running(), 2);
  EXPECT_EQ(scheduler_->reserved_bytes(), 80u);
  runner_.Release("small1");
  runner_.Release("small2");
  ASSERT_TRUE(runner_.WaitFinishedRuns(2));

  // ...but two jobs of 60 out of 100 never do, although two workers are free.
  const v1::Job big1 = MustSubmit(Spec("big1", 0, 60));
  const v1::Job big2 = MustSubmit(Spec("big2", 0, 60));
  ASSERT_TRUE(runner_.WaitStarted("big1"));
  // The condition every free worker waits on is false with big2 at the head (60 + 60 > 100).
  EXPECT_FALSE(scheduler_->CanStartNextForTesting());
  EXPECT_FALSE(runner_.Ran("big2"));
  EXPECT_EQ(scheduler_->Get(big2.id())->state(), v1::JOB_STATE_QUEUED);
  EXPECT_LE(scheduler_->reserved_bytes(), 100u);
  runner_.ReleaseAll();
  EXPECT_EQ(WaitTerminal(big1.id()).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(WaitTerminal(big2.id()).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_LE(runner_.max_reserved(), 100u);
  EXPECT_EQ(runner_.max_reserved(), 80u);
  EXPECT_EQ(scheduler_->reserved_bytes(), 0u);
}

TEST_F(SchedulerTest, HeadOfQueueIsNotStarvedBySmallJobs) {
  options_.max_concurrent_jobs = 2;
  StartScheduler();
  MustSubmit(Spec("first", 0, 60));
  ASSERT_TRUE(runner_.WaitStarted("first"));
  const v1::Job big = MustSubmit(Spec("big", 0, 60));
  const v1::Job small = MustSubmit(Spec("small", 0, 10));  // would fit now, but waits its turn
  // No free worker takes anything: the head (big) does not fit, and small may not pass it.
  EXPECT_FALSE(scheduler_->CanStartNextForTesting());
  EXPECT_FALSE(runner_.Ran("big"));
  EXPECT_FALSE(runner_.Ran("small"));
  runner_.ReleaseAll();
  EXPECT_EQ(WaitTerminal(big.id()).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(WaitTerminal(small.id()).state(), v1::JOB_STATE_SUCCEEDED);
  // big and small may run together now (70 <= 100), so compare when each was started.
  EXPECT_EQ(runner_.order().front(), "first");
  EXPECT_LE(scheduler_->Get(big.id())->started_unix(), scheduler_->Get(small.id())->started_unix());
  EXPECT_LE(runner_.max_reserved(), 100u);
}

TEST_F(SchedulerTest, FullQueueIsResourceExhausted) {
  options_.max_queue = 2;
  StartScheduler();
  MustSubmit(Spec("running"));
  ASSERT_TRUE(runner_.WaitStarted("running"));  // no longer counts against the queue
  MustSubmit(Spec("q1"));
  MustSubmit(Spec("q2"));
  auto full = scheduler_->Submit(Spec("q3"), "");
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  EXPECT_NE(full.status().message().find("queue"), absl::string_view::npos) << full.status();
  // Once a job leaves the queue there is room again.
  runner_.Release("running");
  ASSERT_TRUE(runner_.WaitStarted("q1"));
  const v1::Job q3 = MustSubmit(Spec("q3"));
  runner_.ReleaseAll();
  EXPECT_EQ(WaitTerminal(q3.id()).state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(SchedulerTest, IdempotencyKey) {
  StartScheduler();
  const v1::Job first = MustSubmit(Spec("job"), "key-1");
  EXPECT_EQ(first.idempotency_key(), "key-1");
  const v1::Job again = MustSubmit(Spec("job"), "key-1");
  EXPECT_EQ(again.id(), first.id());
  auto different = scheduler_->Submit(Spec("other"), "key-1");
  EXPECT_EQ(different.status().code(), absl::StatusCode::kAlreadyExists) << different.status();
  EXPECT_NE(different.status().message().find(first.id()), absl::string_view::npos);
  // Another key, or no key, makes a new job.
  const v1::Job key2 = MustSubmit(Spec("job"), "key-2");
  EXPECT_NE(key2.id(), first.id());
  const v1::Job no_key1 = MustSubmit(Spec("job"));
  const v1::Job no_key2 = MustSubmit(Spec("job"));
  EXPECT_NE(no_key1.id(), no_key2.id());
  // Still the same job after it finished.
  runner_.ReleaseAll();
  for (const v1::Job& job : {first, key2, no_key1, no_key2}) {
    EXPECT_EQ(WaitTerminal(job.id()).state(), v1::JOB_STATE_SUCCEEDED);
  }
  const v1::Job after = MustSubmit(Spec("job"), "key-1");
  EXPECT_EQ(after.id(), first.id());
  EXPECT_EQ(after.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(runner_.order().size(), 4u) << "the repeated submits must not run again";
}

TEST_F(SchedulerTest, CancelQueuedJob) {
  StartScheduler();
  const v1::Job blocker = MustSubmit(Spec("blocker"));
  ASSERT_TRUE(runner_.WaitStarted("blocker"));
  const v1::Job queued = MustSubmit(Spec("queued"));
  auto cancelled = scheduler_->Cancel(queued.id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled->error().code(), static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(cancelled->error().code_name(), "CANCELLED");
  EXPECT_EQ(StoredJob(queued.id()).state(), v1::JOB_STATE_CANCELLED);
  // Cancelling again returns the finished job unchanged.
  EXPECT_EQ(scheduler_->Cancel(queued.id())->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(scheduler_->Cancel("no-such-job").status().code(), absl::StatusCode::kNotFound);

  const v1::Job later = MustSubmit(Spec("later"));
  runner_.ReleaseAll();
  EXPECT_EQ(WaitTerminal(blocker.id()).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(WaitTerminal(later.id()).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_FALSE(runner_.Ran("queued"));
  EXPECT_EQ(scheduler_->Get(queued.id())->state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(SchedulerTest, CancelRunningJob) {
  StartScheduler();
  const v1::Job job = MustSubmit(Spec("running"));
  ASSERT_TRUE(runner_.WaitStarted("running"));
  auto response = scheduler_->Cancel(job.id());
  ASSERT_TRUE(response.ok()) << response.status();
  // Cancel only asks a running job to stop: the answer is the job still running, with a note.
  // It ends once the runner notices (it cannot before Cancel returns: ending takes the
  // scheduler's mutex, which Cancel holds while it answers).
  EXPECT_EQ(response->state(), v1::JOB_STATE_RUNNING) << response->DebugString();
  EXPECT_EQ(response->note(), "cancel requested; stopping at the next window");
  const v1::Job done = WaitTerminal(job.id());
  EXPECT_EQ(done.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(done.error().code(), static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(done.output_files_size(), 0);
  const FakeRunner::Call call = runner_.LastCall("running");
  EXPECT_TRUE(call.saw_cancelled);
  EXPECT_FALSE(call.saw_preserve_staging) << "a cancelled job's staging must be removed";
  EXPECT_EQ(StoredJob(job.id()).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(scheduler_->reserved_bytes(), 0u);
}

TEST_F(SchedulerTest, FailureIsRecordedWithCodeAndMessage) {
  StartScheduler();
  runner_.FailWith("bad", absl::DataLossError("shard 3 is truncated"));
  runner_.ReleaseAll();
  const v1::Job job = MustSubmit(Spec("bad"));
  const v1::Job done = WaitTerminal(job.id());
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(done.error().code(), 15);
  EXPECT_EQ(done.error().code_name(), "DATA_LOSS");
  EXPECT_EQ(done.error().message(), "shard 3 is truncated");
  EXPECT_EQ(done.output_files_size(), 0);
  const v1::Job stored = StoredJob(job.id());
  EXPECT_EQ(stored.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(stored.error().message(), "shard 3 is truncated");
  // A runner that returns Cancelled without a cancel request is a failure, not a cancel.
  runner_.FailWith("self-cancel", absl::CancelledError("engine gave up"));
  EXPECT_EQ(WaitTerminal(MustSubmit(Spec("self-cancel")).id()).state(), v1::JOB_STATE_FAILED);
}

TEST_F(SchedulerTest, WaitForChangeReturnsOnProgressAndAtTheEnd) {
  StartScheduler();
  const v1::Job job = MustSubmit(Spec("watched"));
  ASSERT_TRUE(runner_.WaitStarted("watched"));
  int64_t version = -1;
  auto now = scheduler_->WaitForChange(job.id(), &version, absl::ZeroDuration());
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->state(), v1::JOB_STATE_RUNNING);
  const int64_t running_version = version;
  EXPECT_GE(running_version, 1);

  // Nothing changes: the wait times out and leaves the version alone.
  const absl::Time before_timeout = absl::Now();
  auto unchanged = scheduler_->WaitForChange(job.id(), &version, absl::Milliseconds(100));
  ASSERT_TRUE(unchanged.ok());
  EXPECT_GE(absl::Now() - before_timeout, absl::Milliseconds(90));
  EXPECT_EQ(version, running_version);

  // Progress from another thread wakes the waiter.
  std::thread reporter([&] {
    ASSERT_TRUE(WaitForWaiter(job.id()));  // the test thread waits before progress comes
    Progress progress;
    progress.bytes_done = 4;
    progress.bytes_total = 8;
    progress.tensors_done = 1;
    progress.tensors_total = 2;
    progress.files_total = 1;
    runner_.ReportProgress("watched", progress);
  });
  const absl::Time start = absl::Now();
  auto progressed = scheduler_->WaitForChange(job.id(), &version, kWait);
  const absl::Duration waited = absl::Now() - start;
  reporter.join();
  ASSERT_TRUE(progressed.ok()) << progressed.status();
  EXPECT_LT(waited, absl::Seconds(5));
  EXPECT_GT(version, running_version);
  EXPECT_EQ(progressed->progress().bytes_done(), 4u);
  EXPECT_EQ(progressed->progress().bytes_total(), 8u);
  EXPECT_EQ(progressed->progress().tensors_total(), 2);
  EXPECT_EQ(progressed->state(), v1::JOB_STATE_RUNNING);

  // The end wakes it too.
  std::thread finisher([&] {
    ASSERT_TRUE(WaitForWaiter(job.id()));
    runner_.Release("watched");
  });
  const int64_t progress_version = version;
  auto finished = scheduler_->WaitForChange(job.id(), &version, kWait);
  finisher.join();
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(finished->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_GT(version, progress_version);
  // A finished job returns at once.
  const absl::Time again = absl::Now();
  auto terminal = scheduler_->WaitForChange(job.id(), &version, kWait);
  ASSERT_TRUE(terminal.ok());
  EXPECT_LT(absl::Now() - again, absl::Seconds(1));
  EXPECT_EQ(terminal->state(), v1::JOB_STATE_SUCCEEDED);

  int64_t v = -1;
  EXPECT_EQ(scheduler_->WaitForChange("no-such-job", &v, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, ListFiltersAndPagesNewestFirst) {
  StartScheduler();
  runner_.FailWith("j1", absl::InternalError("j1 failed"));
  runner_.FailWith("j3", absl::InternalError("j3 failed"));
  runner_.ReleaseAll();
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(MustSubmit(Spec(absl::StrCat("j", i))).id());
  for (const std::string& id : ids) WaitTerminal(id);

  std::vector<std::string> seen;
  std::string token;
  std::vector<size_t> page_sizes;
  for (int page = 0; page < 10; ++page) {
    auto result = scheduler_->List({}, 2, token);
    ASSERT_TRUE(result.ok()) << result.status();
    page_sizes.push_back(result->jobs.size());
    for (const v1::Job& job : result->jobs) seen.push_back(job.id());
    token = result->next_page_token;
    if (token.empty()) break;
  }
  EXPECT_EQ(page_sizes, (std::vector<size_t>{2, 2, 1}));
  EXPECT_EQ(seen, (std::vector<std::string>{ids[4], ids[3], ids[2], ids[1], ids[0]}));

  auto failed = scheduler_->List({v1::JOB_STATE_FAILED}, 0, "");
  ASSERT_TRUE(failed.ok()) << failed.status();
  ASSERT_EQ(failed->jobs.size(), 2u);
  EXPECT_EQ(failed->jobs[0].id(), ids[3]);
  EXPECT_EQ(failed->jobs[1].id(), ids[1]);
  EXPECT_TRUE(failed->next_page_token.empty());

  auto several = scheduler_->List({v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 4, "");
  ASSERT_TRUE(several.ok());
  EXPECT_EQ(several->jobs.size(), 4u);
  EXPECT_FALSE(several->next_page_token.empty());
  auto rest = scheduler_->List({v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 4,
                               several->next_page_token);
  ASSERT_TRUE(rest.ok());
  ASSERT_EQ(rest->jobs.size(), 1u);
  EXPECT_EQ(rest->jobs[0].id(), ids[0]);

  auto succeeded_page = scheduler_->List({v1::JOB_STATE_SUCCEEDED}, 2, "");
  ASSERT_TRUE(succeeded_page.ok());
  ASSERT_EQ(succeeded_page->jobs.size(), 2u);
  EXPECT_EQ(succeeded_page->jobs[0].id(), ids[4]);
  EXPECT_EQ(succeeded_page->jobs[1].id(), ids[2]);
  auto succeeded_rest =
      scheduler_->List({v1::JOB_STATE_SUCCEEDED}, 2, succeeded_page->next_page_token);
  ASSERT_TRUE(succeeded_rest.ok());
  ASSERT_EQ(succeeded_rest->jobs.size(), 1u);
  EXPECT_EQ(succeeded_rest->jobs[0].id(), ids[0]);
  EXPECT_TRUE(succeeded_rest->next_page_token.empty());

  auto none = scheduler_->List({v1::JOB_STATE_RUNNING}, 0, "");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->jobs.empty());

  EXPECT_EQ(scheduler_->List({}, 0, "not-a-token").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler_->List({}, -1, "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler_->List({}, 1001, "").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, RestartResumesInterruptedJobs) {
  // What a daemon that died leaves behind.
  v1::Job resumable;
  resumable.set_id("j-resumable");
  *resumable.mutable_spec() = Spec("resumable");
  resumable.set_state(v1::JOB_STATE_RUNNING);
  resumable.set_attempts(1);
  resumable.set_created_unix(NowUnix() - 60);
  resumable.set_started_unix(NowUnix() - 50);
  resumable.set_reserved_memory_bytes(10);
  v1::OutputFile* committed = resumable.add_committed_files();
  committed->set_name("model-00001-of-00002.safetensors");
  committed->set_bytes(1000);
  committed->set_xxh3_64("00000000000000ff");
  committed = resumable.add_committed_files();
  committed->set_name("model-00002-of-00002.safetensors");
  committed->set_bytes(2000);
  committed->set_xxh3_64("fedcba9876543210");
  ASSERT_TRUE(store_->Put(resumable).ok());

  v1::Job exhausted;
  exhausted.set_id("j-exhausted");
  *exhausted.mutable_spec() = Spec("exhausted");
  exhausted.set_state(v1::JOB_STATE_RUNNING);
  exhausted.set_attempts(3);
  exhausted.set_created_unix(NowUnix() - 40);
  ASSERT_TRUE(store_->Put(exhausted).ok());

  v1::Job queued;
  queued.set_id("j-queued");
  *queued.mutable_spec() = Spec("queued");
  queued.set_state(v1::JOB_STATE_QUEUED);
  queued.set_idempotency_key("queued-key");
  queued.set_created_unix(NowUnix() - 30);
  ASSERT_TRUE(store_->Put(queued).ok());

  StartScheduler();
  // The exhausted job is failed at once, without running.
  auto failed = scheduler_->Get("j-exhausted");
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(failed->error().message().find("interrupted"), std::string::npos)
      << failed->error().message();
  EXPECT_EQ(StoredJob("j-exhausted").state(), v1::JOB_STATE_FAILED);

  runner_.ReleaseAll();
  const v1::Job resumed = WaitTerminal("j-resumable");
  EXPECT_EQ(resumed.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(resumed.attempts(), 2);
  EXPECT_EQ(resumed.committed_files_size(), 0);
  const FakeRunner::Call call = runner_.LastCall("resumable");
  EXPECT_TRUE(call.resume);
  EXPECT_EQ(call.attempts, 2);

  // A job that never started runs fresh; its idempotency key still finds it.
  const v1::Job fresh = WaitTerminal("j-queued");
  EXPECT_EQ(fresh.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_FALSE(runner_.LastCall("queued").resume);
  EXPECT_EQ(MustSubmit(Spec("queued"), "queued-key").id(), "j-queued");

  EXPECT_FALSE(runner_.Ran("exhausted"));
  EXPECT_EQ(runner_.order(), (std::vector<std::string>{"resumable", "queued"}));
}

TEST_F(SchedulerTest, ShutdownInterruptsRunningJobsForResume) {
  StartScheduler();
  const v1::Job running = MustSubmit(Spec("running"));
  ASSERT_TRUE(runner_.WaitStarted("running"));
  const v1::Job waiting = MustSubmit(Spec("waiting"));

  // A watcher is woken by the shutdown.
  std::thread watcher([&] {
    int64_t version = -1;
    scheduler_->WaitForChange(running.id(), &version, absl::ZeroDuration()).IgnoreError();
    const absl::Time start = absl::Now();
    auto job = scheduler_->WaitForChange(running.id(), &version, kWait);
    EXPECT_TRUE(job.ok());
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  });
  const absl::Time start = absl::Now();
  scheduler_->Shutdown(absl::ZeroDuration());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  watcher.join();
  EXPECT_TRUE(scheduler_->stopping());

  const FakeRunner::Call call = runner_.LastCall("running");
  EXPECT_TRUE(call.saw_cancelled);
  EXPECT_TRUE(call.saw_preserve_staging);
  EXPECT_FALSE(runner_.Ran("waiting"));

  const v1::Job stored = StoredJob(running.id());
  EXPECT_EQ(stored.state(), v1::JOB_STATE_QUEUED);
  EXPECT_FALSE(stored.note().empty());
  EXPECT_EQ(stored.attempts(), 1);
  EXPECT_EQ(StoredJob(waiting.id()).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(scheduler_->Get(running.id())->state(), v1::JOB_STATE_QUEUED);

  auto refused = scheduler_->Submit(Spec("late"), "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  scheduler_->Shutdown(absl::ZeroDuration());  // idempotent

  // The next start resumes the interrupted job first (it was submitted first).
  scheduler_.reset();
  runner_.ReleaseAll();
  StartScheduler();
  EXPECT_EQ(WaitTerminal(running.id()).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(WaitTerminal(waiting.id()).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(runner_.LastCall("running").resume);
  EXPECT_EQ(runner_.LastCall("running").attempts, 2);
  EXPECT_FALSE(runner_.LastCall("waiting").resume);
}

// A job the user cancelled must end CANCELLED even when a shutdown comes before the engine
// noticed the cancel; it must not be kept for resume and run again at the next start.
TEST_F(SchedulerTest, CancelBeforeShutdownStaysCancelled) {
  StartScheduler();
  runner_.Stubborn("slow");
  const v1::Job job = MustSubmit(Spec("slow"));
  ASSERT_TRUE(runner_.WaitStarted("slow"));
  ASSERT_TRUE(scheduler_->Cancel(job.id()).ok());
  std::thread releaser([&] {
    ASSERT_TRUE(WaitStopAccepting());  // the runner returns while Shutdown waits for it
    runner_.Release("slow");
  });
  scheduler_->Shutdown(absl::ZeroDuration());
  releaser.join();
  EXPECT_TRUE(runner_.LastCall("slow").saw_cancelled);
  EXPECT_FALSE(runner_.LastCall("slow").saw_preserve_staging);
  EXPECT_EQ(scheduler_->Get(job.id())->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(StoredJob(job.id()).state(), v1::JOB_STATE_CANCELLED);
}

// A runner that ignores the interruption (blocked in a system call, say) must not keep
// Shutdown waiting: after grace + interrupt_wait its job is recorded QUEUED and resumes at the
// next start; what the abandoned runner returns later is not recorded.
TEST_F(SchedulerTest, ShutdownAbandonsAWorkerThatIgnoresTheInterruption) {
  options_.interrupt_wait = absl::Milliseconds(500);
  StartScheduler();
  runner_.Stubborn("stuck");
  const v1::Job job = MustSubmit(Spec("stuck"));
  ASSERT_TRUE(runner_.WaitStarted("stuck"));

  const absl::Time start = absl::Now();
  EXPECT_EQ(scheduler_->Shutdown(absl::Milliseconds(200)), 1);
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(650));
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_TRUE(scheduler_->stopping());
  EXPECT_EQ(scheduler_->Get(job.id())->state(), v1::JOB_STATE_QUEUED);
  const v1::Job stored = StoredJob(job.id());
  EXPECT_EQ(stored.state(), v1::JOB_STATE_QUEUED);
  EXPECT_NE(stored.note().find("did not respond"), std::string::npos) << stored.note();
  EXPECT_EQ(scheduler_->Shutdown(absl::ZeroDuration()), 1);  // idempotent

  // The runner returns long after: the record is the one Shutdown wrote.
  runner_.Release("stuck");
  ASSERT_TRUE(runner_.WaitFinishedRuns(1));
  scheduler_.reset();  // joins the abandoned worker
  EXPECT_EQ(StoredJob(job.id()).note(), stored.note());

  runner_.ReleaseAll();
  StartScheduler();
  EXPECT_EQ(WaitTerminal(job.id()).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(runner_.LastCall("stuck").resume);
  EXPECT_EQ(runner_.LastCall("stuck").attempts, 2);
}

// A job the user cancelled whose runner then never returns ends CANCELLED, not queued to run
// again.
TEST_F(SchedulerTest, ShutdownAbandonsACancelledStuckJobAsCancelled) {
  options_.interrupt_wait = absl::Milliseconds(200);
  StartScheduler();
  runner_.Stubborn("stuck");
  const v1::Job job = MustSubmit(Spec("stuck"));
  ASSERT_TRUE(runner_.WaitStarted("stuck"));
  ASSERT_TRUE(scheduler_->Cancel(job.id()).ok());
  EXPECT_EQ(scheduler_->Shutdown(absl::ZeroDuration()), 1);
  EXPECT_EQ(StoredJob(job.id()).state(), v1::JOB_STATE_CANCELLED);
  runner_.Release("stuck");
}

TEST_F(SchedulerTest, ShutdownGraceLetsJobsFinish) {
  StartScheduler();
  const v1::Job job = MustSubmit(Spec("quick"));
  ASSERT_TRUE(runner_.WaitStarted("quick"));
  std::thread releaser([&] {
    ASSERT_TRUE(WaitStopAccepting());  // the job ends during the grace
    runner_.Release("quick");
  });
  scheduler_->Shutdown(kWait);
  releaser.join();
  EXPECT_FALSE(runner_.LastCall("quick").saw_cancelled);
  EXPECT_EQ(scheduler_->Get(job.id())->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(StoredJob(job.id()).state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(SchedulerTest, StopAcceptingRefusesSubmissions) {
  StartScheduler();
  const v1::Job before = MustSubmit(Spec("before"), "k");
  scheduler_->StopAccepting();
  auto refused = scheduler_->Submit(Spec("after"), "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_FALSE(scheduler_->stopping());
  // Reads still work.
  EXPECT_TRUE(scheduler_->Get(before.id()).ok());
  EXPECT_TRUE(scheduler_->List({}, 0, "").ok());
}

TEST_F(SchedulerTest, RetentionPrunesOldTerminalJobsAtStart) {
  options_.retention = absl::Hours(1);
  const double now = NowUnix();
  auto put = [&](const std::string& id, v1::JobState state, double finished,
                 const std::string& key) {
    v1::Job job;
    job.set_id(id);
    *job.mutable_spec() = Spec(id);
    job.set_state(state);
    job.set_idempotency_key(key);
    job.set_created_unix(finished - 10);
    if (IsTerminal(state)) job.set_finished_unix(finished);
    ASSERT_TRUE(store_->Put(job).ok());
  };
  put("old-succeeded", v1::JOB_STATE_SUCCEEDED, now - 7200, "old-key");
  put("old-failed", v1::JOB_STATE_FAILED, now - 3700, "");
  put("old-cancelled", v1::JOB_STATE_CANCELLED, now - 7200, "");
  put("recent", v1::JOB_STATE_SUCCEEDED, now - 60, "recent-key");
  put("old-queued", v1::JOB_STATE_QUEUED, now - 7200, "");  // not finished: kept

  StartScheduler();
  for (const std::string id : {"old-succeeded", "old-failed", "old-cancelled"}) {
    EXPECT_EQ(scheduler_->Get(id).status().code(), absl::StatusCode::kNotFound) << id;
  }
  EXPECT_EQ(scheduler_->Get("recent")->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(scheduler_->Get("old-queued").ok());

  auto stored = store_->LoadAll();
  ASSERT_TRUE(stored.ok());
  std::set<std::string> ids;
  for (const v1::Job& job : *stored) ids.insert(job.id());
  EXPECT_EQ(ids, (std::set<std::string>{"recent", "old-queued"}));

  // The pruned job's idempotency key is free again; the kept one still answers.
  EXPECT_NE(MustSubmit(Spec("old-succeeded"), "old-key").id(), "old-succeeded");
  EXPECT_EQ(MustSubmit(Spec("recent"), "recent-key").id(), "recent");
}

// With a zero retention a finished job is pruned at once; a watcher waiting on it must still
// get its final state (the entry must not be freed under the waiter).
TEST_F(SchedulerTest, WaiterSurvivesImmediatePruning) {
  options_.retention = absl::ZeroDuration();
  StartScheduler();
  const v1::Job job = MustSubmit(Spec("short-lived"));
  ASSERT_TRUE(runner_.WaitStarted("short-lived"));
  int64_t version = -1;
  ASSERT_TRUE(scheduler_->WaitForChange(job.id(), &version, absl::ZeroDuration()).ok());
  std::thread releaser([&] {
    ASSERT_TRUE(WaitForWaiter(job.id()));
    runner_.Release("short-lived");
  });
  auto finished = scheduler_->WaitForChange(job.id(), &version, kWait);
  releaser.join();
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(finished->id(), job.id());
  EXPECT_EQ(finished->state(), v1::JOB_STATE_SUCCEEDED);
  // Pruned at the next occasion (another job finishing).
  runner_.ReleaseAll();
  MustSubmit(Spec("next"));
  ASSERT_TRUE(runner_.WaitFinishedRuns(2));
  const absl::Time deadline = absl::Now() + kWait;
  while (scheduler_->Get(job.id()).ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(scheduler_->Get(job.id()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, MetricsFollowTheJobs) {
  StartScheduler();
  EXPECT_EQ(MetricValue("reshard_memory_budget_bytes"), 100);
  const v1::Job a = MustSubmit(Spec("a", 0, 30));
  ASSERT_TRUE(runner_.WaitStarted("a"));
  const v1::Job b = MustSubmit(Spec("b", 0, 30));
  runner_.FailWith("c", absl::InternalError("c failed"));
  const v1::Job c = MustSubmit(Spec("c", 0, 30));
  EXPECT_EQ(MetricValue("reshard_jobs_submitted_total", {{"kind", "consolidate"}}), 3);
  EXPECT_EQ(MetricValue("reshard_jobs_submitted_total", {{"kind", "reshard"}}), 0);
  EXPECT_EQ(MetricValue("reshard_jobs_queued"), 2);
  EXPECT_EQ(MetricValue("reshard_jobs_running"), 1);
  EXPECT_EQ(MetricValue("reshard_memory_reserved_bytes"), 30);
  EXPECT_EQ(scheduler_->reserved_bytes(), 30u);
  EXPECT_EQ(scheduler_->memory_budget(), 100u);
  runner_.ReleaseAll();
  WaitTerminal(a.id());
  WaitTerminal(b.id());
  WaitTerminal(c.id());
  EXPECT_EQ(MetricValue("reshard_jobs_finished_total",
                        {{"kind", "consolidate"}, {"result", "succeeded"}}),
            2);
  EXPECT_EQ(
      MetricValue("reshard_jobs_finished_total", {{"kind", "consolidate"}, {"result", "failed"}}),
      1);
  EXPECT_EQ(MetricValue("reshard_job_duration_seconds", {{"kind", "consolidate"}}), 3);
  EXPECT_EQ(MetricValue("reshard_read_bytes_total"), 200);
  EXPECT_EQ(MetricValue("reshard_written_bytes_total"), 216);
  EXPECT_EQ(MetricValue("reshard_tensors_written_total"), 2);
  EXPECT_EQ(MetricValue("reshard_files_written_total"), 2);
  EXPECT_EQ(MetricValue("reshard_job_phase_duration_seconds", {{"phase", "plan"}}), 2);
  EXPECT_EQ(MetricValue("reshard_job_phase_duration_seconds", {{"phase", "verify"}}), 0);
  EXPECT_EQ(MetricValue("reshard_job_peak_rss_bytes"), 3);
  EXPECT_GT(MetricValue("reshard_last_success_timestamp_seconds", {{"kind", "consolidate"}}), 0);
  EXPECT_EQ(MetricValue("reshard_last_success_timestamp_seconds", {{"kind", "reshard"}}), 0);
  EXPECT_EQ(MetricValue("reshard_jobs_queued"), 0);
  EXPECT_EQ(MetricValue("reshard_jobs_running"), 0);
  EXPECT_EQ(MetricValue("reshard_memory_reserved_bytes"), 0);
}

// A runner that works like the engine on a long job: it reports progress without pause and
// commits a data file every 20 ms, until cancelled.
absl::StatusOr<ConversionResult> BusyRun(const v1::Job&, JobContext& context) {
  Progress progress;
  progress.bytes_total = uint64_t{1} << 40;
  absl::Time next_file = absl::Now();
  while (!context.cancelled.load()) {
    progress.bytes_done += 4096;
    context.on_progress(progress);
    if (absl::Now() >= next_file) {
      next_file = absl::Now() + absl::Milliseconds(20);
      context.on_file_committed(
          {absl::StrCat("model-", progress.files_done++, ".safetensors"), 8, 0xabcdef, 1});
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::CancelledError("stopped at the next window");
}

// Every write of a running job's record (progress, committed files) takes `delay`, like an
// fsync on a congested disk. The delay is spent outside the store's own lock.
void SlowRunningJobWrites(JobStore& store, absl::Duration delay) {
  store.SetPutHookForTesting([delay](const v1::Job& job) {
    if (job.state() == v1::JOB_STATE_RUNNING && job.progress().bytes_done() > 0) {
      absl::SleepFor(delay);
    }
  });
}

struct Latencies {
  absl::Duration p50, p99, max;
};

Latencies Summarize(std::vector<absl::Duration> samples) {
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  return {samples[n / 2], samples[std::min(n - 1, n * 99 / 100)], samples[n - 1]};
}

// One job's slow progress writes must not hold up reads and submissions: the scheduler's
// mutex is not held across a store write.
TEST_F(SchedulerTest, SlowProgressWritesDoNotBlockSubmitOrGet) {
  SlowRunningJobWrites(*store_, absl::Seconds(1));
  options_.persist_interval = absl::Milliseconds(10);
  options_.memory_budget = 1000;
  scheduler_ = std::make_unique<Scheduler>(options_, store_.get(), &metrics_, BusyRun, Estimate);
  ASSERT_TRUE(scheduler_->Start().ok());
  const v1::Job busy = MustSubmit(Spec("busy"));
  WaitUntil(busy.id(), [](const v1::Job& job) { return job.progress().bytes_done() > 0; });
  std::vector<absl::Duration> gets, submits;
  for (int i = 0; i < 20; ++i) {
    absl::Time start = absl::Now();
    ASSERT_TRUE(scheduler_->Get(busy.id()).ok());
    gets.push_back(absl::Now() - start);
    start = absl::Now();
    MustSubmit(Spec(absl::StrCat("queued-", i)));
    submits.push_back(absl::Now() - start);
    absl::SleepFor(absl::Milliseconds(20));
  }
  // Gets and submits do not wait for the busy job's store write (1 s here). A submit does its own
  // (real, unslowed) write, hence the looser bound on its worst case.
  EXPECT_LT(Summarize(gets).max, absl::Milliseconds(300));
  EXPECT_LT(Summarize(submits).p50, absl::Milliseconds(100));
  EXPECT_LT(Summarize(submits).max, absl::Milliseconds(500));
  scheduler_->Shutdown(absl::ZeroDuration());
  // The record still caught up with the progress (written outside the lock).
  EXPECT_GT(StoredJob(busy.id()).progress().bytes_done(), 0u);
}

// A committed file's record is in the store when on_file_committed returns, even while the
// persister is writing an older copy (progress) of the same job.
TEST_F(SchedulerTest, CommittedFileIsDurableWhenTheCallbackReturns) {
  // The persister's write of the progress takes 200 ms, and says when it has begun.
  absl::Notification progress_write_started;
  store_->SetPutHookForTesting([&](const v1::Job& job) {
    if (job.state() == v1::JOB_STATE_RUNNING && job.progress().bytes_done() > 0) {
      if (!progress_write_started.HasBeenNotified()) progress_write_started.Notify();
      absl::SleepFor(absl::Milliseconds(200));
    }
  });
  options_.persist_interval = absl::Milliseconds(1);
  JobStore* const store = store_.get();
  std::atomic<int> recorded{-1};
  auto runner = [&](const v1::Job& job, JobContext& context) -> absl::StatusOr<ConversionResult> {
    Progress progress;
    progress.bytes_total = 100;
    progress.bytes_done = 10;
    context.on_progress(progress);
    if (!progress_write_started.WaitForNotificationWithTimeout(kWait)) {
      return absl::DeadlineExceededError("the persister never wrote the progress");
    }
    context.on_file_committed({"model-1.safetensors", 8, 0xabc, 1});
    auto jobs = store->LoadAll();
    if (!jobs.ok()) return jobs.status();
    for (const v1::Job& stored : *jobs) {
      if (stored.id() == job.id()) recorded.store(stored.committed_files_size());
    }
    return absl::DataLossError("stop here");
  };
  scheduler_ = std::make_unique<Scheduler>(options_, store_.get(), &metrics_, runner, Estimate);
  ASSERT_TRUE(scheduler_->Start().ok());
  const v1::Job job = MustSubmit(Spec("committing"));
  EXPECT_EQ(WaitTerminal(job.id()).state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(recorded.load(), 1);
}

// Load test: submit latency while two jobs run flat out, with the real store
// (SQLite, synchronous=FULL) and with a simulated slow disk (every running job's write takes
// 200 ms). Prints p50/p99/max; run with --test_output=streamed --test_filter='*Latency*'.
TEST_F(SchedulerTest, SubmitLatencyWhileJobsRunLoadTest) {
  options_.max_concurrent_jobs = 2;
  options_.memory_budget = 1000;
  options_.max_queue = 1000;
  for (const absl::Duration slow : {absl::ZeroDuration(), absl::Milliseconds(200)}) {
    SlowRunningJobWrites(*store_, slow);
    scheduler_ = std::make_unique<Scheduler>(options_, store_.get(), &metrics_, BusyRun, Estimate);
    ASSERT_TRUE(scheduler_->Start().ok());
    MustSubmit(Spec("busy-1"));
    MustSubmit(Spec("busy-2"));
    // Two jobs run (at the second start, the two the first shutdown interrupted resume first).
    ASSERT_TRUE(WaitFor([&] { return MetricValue("reshard_jobs_running") == 2; }))
        << "two jobs did not start";
    std::vector<absl::Duration> submits;
    for (int i = 0; i < 150; ++i) {
      const absl::Time start = absl::Now();
      MustSubmit(Spec(absl::StrCat("queued-", i)));
      submits.push_back(absl::Now() - start);
      absl::SleepFor(absl::Milliseconds(5));
    }
    const Latencies figures = Summarize(submits);
    std::fprintf(
        stderr, "submit latency with 2 busy jobs, running job writes +%s: p50 %s p99 %s max %s\n",
        absl::FormatDuration(slow).c_str(), absl::FormatDuration(figures.p50).c_str(),
        absl::FormatDuration(figures.p99).c_str(), absl::FormatDuration(figures.max).c_str());
    // With 200 ms writes the bounds hold only if no submit waits for a running job's write.
    // With the real store the figures are the disk's and the machine's, so they are printed
    // but not checked.
    if (slow > absl::ZeroDuration()) {
      EXPECT_LT(figures.p50, absl::Milliseconds(50));
      EXPECT_LT(figures.p99, absl::Milliseconds(200));
    }
    scheduler_->Shutdown(absl::ZeroDuration());
    scheduler_.reset();
  }
}
}  // namespace
}  // namespace reshard
