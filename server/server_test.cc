#include "server/server.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "lib/engine/conversion.h"
#include "lib/testing/test_files.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "server/job_runner.h"
#include "server/job_store.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;
using HealthStatus = grpc::health::v1::HealthCheckResponse;

constexpr absl::Duration kWait = absl::Seconds(20);  // bound of every wait in these tests

std::string Real(const std::string& path) {
  char resolved[PATH_MAX];
  EXPECT_NE(::realpath(path.c_str(), resolved), nullptr) << path;
  return resolved;
}

// One F32 tensor "w" of shape [2] holding {1, 2}.
void WriteTinySafetensors(const std::string& path) {
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  while (header.size() % 8 != 0) header.push_back(' ');
  std::string file;
  const uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) file.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  file += header;
  const float values[2] = {1.0f, 2.0f};
  file.append(reinterpret_cast<const char*>(values), sizeof(values));
  std::ofstream(path, std::ios::binary)
      .write(file.data(), static_cast<std::streamsize>(file.size()));
}

// A plain HTTP/1.0 GET (no chunked encoding); returns the body of a 200 answer.
absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError(host_port);
  int port = 0;
  if (!absl::SimpleAtoi(host_port.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(host_port);
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &address.sin_addr) != 1) {
    return absl::InvalidArgumentError(host_port);
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("connect to ", host_port, ": ", strerror(errno)));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, 0);
    if (n <= 0) {
      ::close(fd);
      return absl::UnavailableError("send");
    }
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0) {
      ::close(fd);
      return absl::DeadlineExceededError("recv");
    }
    if (n == 0) break;
    response.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return absl::DataLossError("no HTTP header end: " + response);
  const std::string status_line = response.substr(0, response.find("\r\n"));
  if (status_line.find(" 200") == std::string::npos) {
    return absl::UnknownError("HTTP answer: " + status_line);
  }
  return response.substr(body + 4);
}

// The value of the sample `series` (name with labels, exactly as exposed), or -1.
double SampleValue(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, series + " ")) continue;
    double value = -1;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
  }
  return -1;
}

// Behaviour by the output folder's name: "block*" runs until cancelled or released,
// "stuck*" ignores cancellation and runs until released, "fail*" fails with DATA_LOSS,
// anything else succeeds at once. Every run reports progress.
class FakeRunner {
 public:
  struct Seen {
    int runs = 0;
    bool resume = false;
    bool cancelled = false;
    bool preserve_staging = false;
  };

  JobRunner AsRunner() {
    return [this](const v1::Job& job, JobContext& context) { return Run(job, context); };
  }
  void ReleaseAll() { released_.store(true); }
  Seen seen(const std::string& name) {
    absl::MutexLock lock(&mu_);
    return seen_[name];
  }

 private:
  absl::StatusOr<ConversionResult> Run(const v1::Job& job, JobContext& context) {
    const std::string name = fs::path(job.spec().output()).filename().string();
    {
      absl::MutexLock lock(&mu_);
      Seen& seen = seen_[name];
      ++seen.runs;
      seen.resume = context.resume;
    }
    Progress progress;
    progress.bytes_total = 8;
    progress.bytes_done = 4;
    progress.tensors_total = 1;
    progress.files_total = 1;
    context.on_progress(progress);
    if (absl::StartsWith(name, "block")) {
      const absl::Time deadline = absl::Now() + kWait;
      while (!context.cancelled.load() && !released_.load() && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(2));
      }
      if (context.cancelled.load()) {
        absl::MutexLock lock(&mu_);
        seen_[name].cancelled = true;
        seen_[name].preserve_staging = context.preserve_staging.load();
        return absl::CancelledError("cancelled at the next window");
      }
    }
    if (absl::StartsWith(name, "stuck")) {
      const absl::Time deadline = absl::Now() + kWait;
      while (!released_.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
    }
    if (absl::StartsWith(name, "fail")) return absl::DataLossError("injected failure");
    progress.bytes_done = 8;
    progress.tensors_done = 1;
    progress.files_done = 1;
    context.on_progress(progress);
    ConversionResult result;
    result.output = job.spec().output();
    result.files.push_back({"model.safetensors", 88, 0x1234, 1});
    result.tensors = 1;
    result.bytes_read = 8;
    result.bytes_written = 200;
    return result;
  }

  std::atomic<bool> released_{false};
  absl::Mutex mu_;
  std::map<std::string, Seen> seen_ ABSL_GUARDED_BY(mu_);
};

class ServerTest : public testing::Test {
 protected:
  void SetUp() override {
    base_ = MakeTempDir("server");
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    state_dir_ = base_ + "/state";
    fs::create_directories(root_);
    fs::create_directories(outside_);
    WriteTinySafetensors(root_ + "/model.safetensors");
    WriteTinySafetensors(outside_ + "/model.safetensors");
    fs::create_directory_symlink(outside_, root_ + "/link");
  }

  void TearDown() override {
    runner_.ReleaseAll();
    client_.reset();
    server_.reset();
  }

  ServerOptions Options() {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.state_dir = state_dir_;
    options.allowed_roots = {root_};
    options.scheduler.memory_budget = 1 << 20;
    options.scheduler.max_concurrent_jobs = 2;
    options.shutdown_grace = absl::ZeroDuration();
    options.runner = runner_.AsRunner();
    options.estimator = [](const v1::JobSpec&) -> uint64_t { return 1000; };
    return options;
  }

  void StartServer(ServerOptions options) {
    auto server = Server::Start(std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_FALSE(server_->address().empty());
    ASSERT_NE(server_->address(), "127.0.0.1:0");
    ClientOptions client_options;
    client_options.address = server_->address();
    client_options.rpc_timeout = absl::Seconds(10);
    client_options.max_attempts = 1;
    client_options.initial_backoff = absl::Milliseconds(20);
    auto client = Client::Connect(client_options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  v1::JobSpec Consolidate(const std::string& output_name) {
    v1::JobSpec spec;
    spec.set_kind(v1::JOB_KIND_CONSOLIDATE);
    spec.set_input(root_ + "/model.safetensors");
    spec.set_output(root_ + "/" + output_name);
    return spec;
  }

  v1::Job MustSubmit(const v1::JobSpec& spec, const std::string& key = "") {
    auto job = client_->Submit(spec, key);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  // Follows the job to its end with the client's Watch.
  v1::Job WatchToEnd(const std::string& id, std::vector<v1::Job>* events = nullptr) {
    auto job = client_->Watch(id, [&](const v1::Job& event) {
      if (events != nullptr) events->push_back(event);
    });
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  bool WaitForState(const std::string& id, v1::JobState state) {
    const absl::Time deadline = absl::Now() + kWait;
    while (absl::Now() < deadline) {
      auto job = client_->Get(id);
      if (job.ok() && job->state() == state) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  absl::StatusOr<HealthStatus::ServingStatus> Health(const std::string& address) {
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service("");
    HealthStatus response;
    grpc::Status status = stub->Check(&context, request, &response);
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    return response.status();
  }

  std::string base_, root_, outside_, state_dir_;
  FakeRunner runner_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ServerTest, SubmitWatchGet) {
  StartServer(Options());
  const v1::Job submitted = MustSubmit(Consolidate("out1"));
  ASSERT_FALSE(submitted.id().empty());
  // SubmitJob answers with the job as it is queued: no worker can take it before the answer
  // is copied (starting it takes the scheduler's mutex, which Submit holds until then).
  EXPECT_EQ(submitted.state(), v1::JOB_STATE_QUEUED);
  // The stored spec has the resolved paths.
  EXPECT_EQ(submitted.spec().input(), Real(root_) + "/model.safetensors");
  EXPECT_EQ(submitted.spec().output(), Real(root_) + "/out1");
  EXPECT_EQ(submitted.reserved_memory_bytes(), 1000u);

  std::vector<v1::Job> events;
  const v1::Job done = WatchToEnd(submitted.id(), &events);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::JOB_STATE_SUCCEEDED);
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_GE(events[i].state(), events[i - 1].state()) << "states went backwards";
  }
  ASSERT_EQ(done.output_files_size(), 1);
  EXPECT_EQ(done.output_files(0).name(), "model.safetensors");
  EXPECT_EQ(done.output_files(0).xxh3_64(), "0000000000001234");
  EXPECT_EQ(done.bytes_written(), 200u);
  EXPECT_EQ(done.progress().bytes_done(), 8u);

  auto got = client_->Get(submitted.id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(got->id(), submitted.id());

  auto missing = client_->Get("j-does-not-exist");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  // Watching an unknown job ends with NOT_FOUND, without reconnecting forever.
  auto watch_missing = client_->Watch("j-does-not-exist", nullptr);
  EXPECT_EQ(watch_missing.status().code(), absl::StatusCode::kNotFound) << watch_missing.status();
}

TEST_F(ServerTest, WatchReportsRunningThenTheEnd) {
  StartServer(Options());
  const v1::Job job = MustSubmit(Consolidate("block-watch"));
  absl::Mutex mu;
  std::vector<v1::Job> events;
  v1::Job final_job;
  std::thread watcher([&] {
    auto done = client_->Watch(job.id(), [&](const v1::Job& event) {
      absl::MutexLock lock(&mu);
      events.push_back(event);
    });
    EXPECT_TRUE(done.ok()) << done.status();
    if (done.ok()) final_job = *done;
  });
  {
    absl::MutexLock lock(&mu);
    auto running = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      for (const v1::Job& event : events) {
        if (event.state() == v1::JOB_STATE_RUNNING && event.progress().bytes_done() == 4) {
          return true;
        }
      }
      return false;
    };
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&running), kWait))
        << "no RUNNING event with progress";
  }
  runner_.ReleaseAll();
  watcher.join();
  EXPECT_EQ(final_job.state(), v1::JOB_STATE_SUCCEEDED);
  absl::MutexLock lock(&mu);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back().state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(ServerTest, CancelRunningAndFailedJobs) {
  StartServer(Options());
  const v1::Job job = MustSubmit(Consolidate("block-cancel"));
  ASSERT_TRUE(WaitForState(job.id(), v1::JOB_STATE_RUNNING));
  auto cancel = client_->Cancel(job.id());
  ASSERT_TRUE(cancel.ok()) << cancel.status();
  EXPECT_EQ(cancel->id(), job.id());
  const v1::Job cancelled = WatchToEnd(job.id());
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled.error().code(), static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_TRUE(runner_.seen("block-cancel").cancelled);
  EXPECT_FALSE(runner_.seen("block-cancel").preserve_staging);
  EXPECT_EQ(client_->Cancel("j-nope").status().code(), absl::StatusCode::kNotFound);

  const v1::Job failing = MustSubmit(Consolidate("fail-1"));
  const v1::Job failed = WatchToEnd(failing.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.error().code_name(), "DATA_LOSS");
  EXPECT_EQ(failed.error().message(), "injected failure");
}

TEST_F(ServerTest, ListFiltersAndPages) {
  StartServer(Options());
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(MustSubmit(Consolidate(absl::StrCat("out", i))).id());
    WatchToEnd(ids.back());
  }
  ids.push_back(MustSubmit(Consolidate("fail-x")).id());
  WatchToEnd(ids.back());

  auto all = client_->List({}, 0, "");
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->jobs_size(), 4);
  EXPECT_EQ(all->jobs(0).id(), ids[3]);
  EXPECT_EQ(all->jobs(3).id(), ids[0]);
  EXPECT_TRUE(all->next_page_token().empty());

  auto first = client_->List({}, 3, "");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->jobs_size(), 3);
  ASSERT_FALSE(first->next_page_token().empty());
  auto second = client_->List({}, 3, first->next_page_token());
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->jobs_size(), 1);
  EXPECT_EQ(second->jobs(0).id(), ids[0]);

  auto failed = client_->List({v1::JOB_STATE_FAILED}, 0, "");
  ASSERT_TRUE(failed.ok()) << failed.status();
  ASSERT_EQ(failed->jobs_size(), 1);
  EXPECT_EQ(failed->jobs(0).id(), ids[3]);

  EXPECT_EQ(client_->List({}, 0, "garbage").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->List({}, 5000, "").status().code(), absl::StatusCode::kInvalidArgument);

  // A state that is none of the job states is refused, naming it, rather than matching no job.
  auto unspecified = client_->List({v1::JOB_STATE_FAILED, v1::JOB_STATE_UNSPECIFIED}, 0, "");
  EXPECT_EQ(unspecified.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(unspecified.status().message(), "states[1] = 0"))
      << unspecified.status();
  auto stub = v1::Reshard::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListJobsRequest request;
  request.mutable_states()->Add(42);  // unknown to this proto: kept as a number
  v1::ListJobsResponse response;
  const grpc::Status unknown = stub->ListJobs(&context, request, &response);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(unknown.error_message(), "states[0] = 42"))
      << unknown.error_message();
}

TEST_F(ServerTest, IdempotentResubmit) {
  StartServer(Options());
  const v1::Job first = MustSubmit(Consolidate("idem"), "slurm-42-7");
  const v1::Job again = MustSubmit(Consolidate("idem"), "slurm-42-7");
  EXPECT_EQ(again.id(), first.id());
  // The same spec spelled differently (a ".." that stays inside) is the same once resolved.
  fs::create_directories(root_ + "/sub");
  v1::JobSpec respelled = Consolidate("idem");
  respelled.set_output(root_ + "/sub/../idem");
  respelled.set_input(root_ + "/sub/../model.safetensors");
  EXPECT_EQ(MustSubmit(respelled, "slurm-42-7").id(), first.id());
  auto different = client_->Submit(Consolidate("idem-other"), "slurm-42-7");
  EXPECT_EQ(different.status().code(), absl::StatusCode::kAlreadyExists) << different.status();
  EXPECT_EQ(WatchToEnd(first.id()).state(), v1::JOB_STATE_SUCCEEDED);
  auto list = client_->List({}, 0, "");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->jobs_size(), 1);
}

TEST_F(ServerTest, PlanAndInspect) {
  StartServer(Options());
  v1::JobSpec spec = Consolidate("planned");
  spec.set_memory_budget(4096);
  auto plan = client_->Plan(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GE(plan->files_size(), 1);
  int tensors = 0;
  bool has_data_file = false;
  for (const v1::PlannedFile& file : plan->files()) {
    tensors += file.tensors();
    if (absl::EndsWith(file.name(), ".safetensors")) {
      has_data_file = true;
      EXPECT_GT(file.bytes(), 8u) << file.name();
    }
  }
  EXPECT_TRUE(has_data_file) << plan->DebugString();
  EXPECT_EQ(tensors, 1);
  EXPECT_GE(plan->total_bytes(), 8u);
  // The conversion's own estimate, as `reshardctl plan` reports it without a daemon; not the
  // spec's memory budget.
  absl::StatusOr<ConversionSpec> conversion = ConversionSpecFromProto(spec);
  ASSERT_TRUE(conversion.ok()) << conversion.status();
  auto local = PlanConversion(*conversion);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_GT(plan->memory_bytes(), 0u);
  EXPECT_EQ(plan->memory_bytes(), local->memory_bytes);
  EXPECT_FALSE(fs::exists(root_ + "/planned")) << "a plan writes nothing";
  auto jobs = client_->List({}, 0, "");
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->jobs_size(), 0) << "a plan is not a job";

  auto inspect = client_->Inspect(root_ + "/model.safetensors", "");
  ASSERT_TRUE(inspect.ok()) << inspect.status();
  EXPECT_EQ(inspect->format(), "safetensors");
  EXPECT_EQ(inspect->parts(), 1);
  ASSERT_EQ(inspect->tensors_size(), 1);
  EXPECT_EQ(inspect->tensors(0).name(), "w");
  EXPECT_EQ(inspect->tensors(0).dtype(), "F32");
  ASSERT_EQ(inspect->tensors(0).shape_size(), 1);
  EXPECT_EQ(inspect->tensors(0).shape(0), 2);
  EXPECT_EQ(inspect->tensors(0).bytes(), 8u);
  EXPECT_EQ(inspect->total_bytes(), 8u);
  ASSERT_EQ(inspect->files_size(), 1);
  EXPECT_GT(inspect->files(0).bytes(), 8u);

  EXPECT_EQ(client_->Inspect(root_ + "/missing.safetensors", "").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Inspect(root_ + "/model.safetensors", "{bad").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Inspect and Plan reserve an eighth of the memory budget for the metadata they parse; with
// running jobs holding more than the rest, they are refused at once.
TEST_F(ServerTest, InspectAndPlanReserveMetadataMemoryFromTheBudget) {
  StartServer(Options());  // budget 1 MiB: the metadata allowance is 128 KiB
  v1::JobSpec big = Consolidate("block-budget");
  big.set_memory_budget((1 << 20) - (64 << 10));
  const v1::Job job = MustSubmit(big);
  ASSERT_TRUE(WaitForState(job.id(), v1::JOB_STATE_RUNNING));
  const std::string refusal =
      " needs 131072 bytes of the daemon's memory budget for metadata, but only 65536 of its "
      "1048576 bytes (--memory-budget) are free; retry when jobs finish";
  auto inspect = client_->Inspect(root_ + "/model.safetensors", "");
  EXPECT_EQ(inspect.status().code(), absl::StatusCode::kResourceExhausted) << inspect.status();
  EXPECT_EQ(inspect.status().message(), "Inspect" + refusal);
  auto plan = client_->Plan(Consolidate("planned"));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  EXPECT_EQ(plan.status().message(), "Plan" + refusal);
  // Nothing stays reserved by the refused calls; once the job ends both run.
  EXPECT_EQ(server_->scheduler().reserved_bytes(), big.memory_budget());
  runner_.ReleaseAll();
  EXPECT_EQ(WatchToEnd(job.id()).state(), v1::JOB_STATE_SUCCEEDED);
  inspect = client_->Inspect(root_ + "/model.safetensors", "");
  EXPECT_TRUE(inspect.ok()) << inspect.status();
  // The pool thread gives the reservation back when it drops the finished task.
  const absl::Time deadline = absl::Now() + kWait;
  while (server_->scheduler().reserved_bytes() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(server_->scheduler().reserved_bytes(), 0u);
}

TEST_F(ServerTest, MalformedRequestsNameTheField) {
  StartServer(Options());
  struct Case {
    std::string what;
    v1::JobSpec spec;
    std::string key;
    absl::StatusCode code;
    std::string field;
  };
  std::vector<Case> cases;
  {
    v1::JobSpec spec = Consolidate("bad");
    spec.set_kind(v1::JOB_KIND_UNSPECIFIED);
    cases.push_back(
        {"kind unspecified", spec, "", absl::StatusCode::kInvalidArgument, "spec.kind"});
  }
  {
    // A reshard without rules is accepted (Megatron inputs bring their own); a tag that is a
    // path, not a folder name inside the input, is not.
    v1::JobSpec spec = Consolidate("bad");
    spec.set_tag("../other/global_step1");
    cases.push_back({"tag with a path", spec, "", absl::StatusCode::kInvalidArgument, "spec.tag"});
  }
  {
    v1::JobSpec spec = Consolidate("bad");
    spec.set_io("mmap");
    cases.push_back({"unknown io mode", spec, "", absl::StatusCode::kInvalidArgument, "spec.io"});
  }
  for (auto [index, count] : {std::pair{2, 2}, {-1, 2}, {0, -1}, {1, 0}, {0, 4097}}) {
    v1::JobSpec spec = Consolidate("bad");
    spec.set_partition_index(index);
    spec.set_partition_count(count);
    cases.push_back({absl::StrCat("partition ", index, "/", count), spec, "",
                     absl::StatusCode::kInvalidArgument, "spec.partition_index"});
  }
  for (int parts : {0, -1, 4097}) {
    v1::JobSpec spec = Consolidate("bad");
    spec.set_kind(v1::JOB_KIND_RESHARD);
    spec.set_parts(parts);
    spec.set_rules_json(R"({"rules": [{"pattern": ".*", "replicate": true}]})");
    cases.push_back({absl::StrCat("parts ", parts), spec, "", absl::StatusCode::kInvalidArgument,
                     "spec.parts"});
  }
  {
    v1::JobSpec spec = Consolidate("bad");
    spec.set_parts(2);
    cases.push_back(
        {"parts on consolidate", spec, "", absl::StatusCode::kInvalidArgument, "spec.parts"});
  }
  {
    v1::JobSpec spec = Consolidate("bad");
    spec.set_pipeline_parts(2);
    cases.push_back({"pipeline_parts on consolidate", spec, "", absl::StatusCode::kInvalidArgument,
                     "spec.pipeline_parts"});
  }
  for (int pipeline_parts : {-1, 4097}) {
    v1::JobSpec spec = Consolidate("bad");
    spec.set_kind(v1::JOB_KIND_RESHARD);
    spec.set_parts(2);
    spec.set_pipeline_parts(pipeline_parts);
    spec.set_rules_json(R"({"rules": [{"pattern": ".*", "replicate": true}]})");
    cases.push_back({absl::StrCat("pipeline_parts ", pipeline_parts), spec, "",
                     absl::StatusCode::kInvalidArgument, "spec.pipeline_parts"});
  }
  {
    v1::JobSpec spec = Consolidate("bad");
    spec.set_output_format("no-such-format");
    cases.push_back({"unknown output format", spec, "", absl::StatusCode::kInvalidArgument,
                     "spec.output_format"});
  }
  for (const std::string rules : {"{not json", R"({"rules": 3})", R"({"rules": [{"x": 1}]})"}) {
    v1::JobSpec spec = Consolidate("bad");
    spec.set_kind(v1::JOB_KIND_RESHARD);
    spec.set_parts(2);
    spec.set_rules_json(rules);
    cases.push_back(
        {"rules " + rules, spec, "", absl::StatusCode::kInvalidArgument, "spec.rules_json"});
  }
  cases.push_back({"long key", Consolidate("bad"), std::string(257, 'k'),
                   absl::StatusCode::kInvalidArgument, "idempotency_key"});
  {
    v1::JobSpec spec = Consolidate("bad");
    spec.set_threads(65);
    cases.push_back({"threads", spec, "", absl::StatusCode::kInvalidArgument, "spec.threads"});
  }
  {
    v1::JobSpec spec = Consolidate("bad");
    spec.set_priority(101);
    cases.push_back({"priority", spec, "", absl::StatusCode::kInvalidArgument, "spec.priority"});
  }
  {
    v1::JobSpec spec = Consolidate("bad");
    spec.set_dtype(static_cast<v1::DType>(77));
    cases.push_back({"dtype", spec, "", absl::StatusCode::kInvalidArgument, "spec.dtype"});
  }
  {
    v1::JobSpec spec = Consolidate("bad");
    spec.clear_output();
    cases.push_back({"no output", spec, "", absl::StatusCode::kInvalidArgument, "spec.output"});
  }
  {
    v1::JobSpec spec = Consolidate("bad");
    spec.clear_input();
    cases.push_back({"no input", spec, "", absl::StatusCode::kInvalidArgument, "spec.input"});
  }
  {
    v1::JobSpec spec = Consolidate("bad");
    spec.set_input("root/model.safetensors");
    cases.push_back({"relative input", spec, "", absl::StatusCode::kInvalidArgument, "input"});
  }
  {
    fs::create_directories(root_ + "/d");
    WriteTinySafetensors(root_ + "/d/model.safetensors");
    v1::JobSpec spec = Consolidate("bad");
    spec.set_input(root_ + "/d/model.safetensors");
    spec.set_output(root_ + "/d");
    spec.set_overwrite(true);
    cases.push_back(
        {"output contains input", spec, "", absl::StatusCode::kInvalidArgument, "spec.output"});
    spec.set_input(root_ + "/d");
    cases.push_back(
        {"output is the input", spec, "", absl::StatusCode::kInvalidArgument, "spec.output"});
  }
  {
    fs::create_directories(root_ + "/full");
    std::ofstream(root_ + "/full/existing") << "x";
    cases.push_back(
        {"non-empty output", Consolidate("full"), "", absl::StatusCode::kFailedPrecondition, ""});
  }
  for (const Case& c : cases) {
    auto job = client_->Submit(c.spec, c.key);
    ASSERT_FALSE(job.ok()) << c.what << " was accepted";
    EXPECT_EQ(job.status().code(), c.code) << c.what << ": " << job.status();
    EXPECT_NE(job.status().message().find(c.field), absl::string_view::npos)
        << c.what << ": " << job.status();
    if (c.key.empty()) {
      auto plan = client_->Plan(c.spec);
      if (c.code == absl::StatusCode::kInvalidArgument) {
        EXPECT_EQ(plan.status().code(), c.code) << c.what << " (plan): " << plan.status();
      }
    }
  }
  auto list = client_->List({}, 0, "");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->jobs_size(), 0) << "no malformed request may create a job";
}

TEST_F(ServerTest, PathsOutsideRootsAreDenied) {
  StartServer(Options());
  std::vector<std::pair<std::string, v1::JobSpec>> cases;
  v1::JobSpec spec = Consolidate("out");
  spec.set_input(outside_ + "/model.safetensors");
  cases.push_back({"input outside", spec});
  spec = Consolidate("out");
  spec.set_output(outside_ + "/out");
  cases.push_back({"output outside", spec});
  spec = Consolidate("out");
  spec.set_input(root_ + "/../outside/model.safetensors");
  cases.push_back({"input ..", spec});
  spec = Consolidate("out");
  spec.set_output(root_ + "/sub/../../outside/out");
  cases.push_back({"output ..", spec});
  spec = Consolidate("out");
  spec.set_input(root_ + "/link/model.safetensors");
  cases.push_back({"input through symlink", spec});
  spec = Consolidate("out");
  spec.set_output(root_ + "/link/out");
  cases.push_back({"output through symlink", spec});
  spec = Consolidate("out");
  spec.set_output(root_);
  cases.push_back({"output is the root", spec});
  for (const auto& [what, bad] : cases) {
    auto job = client_->Submit(bad, "");
    EXPECT_EQ(job.status().code(), absl::StatusCode::kPermissionDenied)
        << what << ": " << job.status();
    EXPECT_EQ(client_->Plan(bad).status().code(), absl::StatusCode::kPermissionDenied) << what;
  }
  EXPECT_EQ(client_->Inspect(outside_ + "/model.safetensors", "").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(client_->Inspect(root_ + "/link/model.safetensors", "").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(fs::exists(outside_ + "/out"));
  auto list = client_->List({}, 0, "");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->jobs_size(), 0);
}

TEST_F(ServerTest, HealthServingThenGone) {
  StartServer(Options());
  auto serving = Health(server_->address());
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_EQ(*serving, HealthStatus::SERVING);
  const std::string address = server_->address();
  server_->Shutdown();
  // The listener is closed: the health check cannot connect at all.
  auto after = Health(address);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable) << after.status();
  const auto gone = client_->Get("anything");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable) << gone.status();
}

TEST_F(ServerTest, DrainRefusesSubmitsAndKeepsRunningJobForResume) {
  ServerOptions options = Options();
  options.shutdown_grace = absl::Milliseconds(1500);
  StartServer(options);
  const v1::Job job = MustSubmit(Consolidate("block-drain"));
  ASSERT_TRUE(WaitForState(job.id(), v1::JOB_STATE_RUNNING));

  const absl::Time start = absl::Now();
  std::thread stopper([&] { server_->Shutdown(); });
  bool not_serving = false;
  while (absl::Now() - start < absl::Seconds(1) && !not_serving) {
    auto health = Health(server_->address());
    not_serving = health.ok() && *health == HealthStatus::NOT_SERVING;
    if (!not_serving) absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(not_serving) << "health did not go NOT_SERVING while draining";
  auto refused = client_->Submit(Consolidate("late"), "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  // Reads still work while draining.
  auto during = client_->Get(job.id());
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_EQ(during->state(), v1::JOB_STATE_RUNNING);
  stopper.join();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(1400)) << "the grace period was not given";
  EXPECT_TRUE(runner_.seen("block-drain").cancelled);
  EXPECT_TRUE(runner_.seen("block-drain").preserve_staging);
  client_.reset();
  server_.reset();

  {
    auto store = JobStore::Open(state_dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    auto jobs = (*store)->LoadAll();
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    ASSERT_EQ(jobs->size(), 1u);
    EXPECT_EQ((*jobs)[0].id(), job.id());
    EXPECT_EQ((*jobs)[0].state(), v1::JOB_STATE_QUEUED);
    EXPECT_FALSE((*jobs)[0].note().empty());
  }

  // The next daemon on the same state dir resumes it.
  runner_.ReleaseAll();
  StartServer(Options());
  const v1::Job resumed = WatchToEnd(job.id());
  EXPECT_EQ(resumed.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(resumed.attempts(), 2);
  EXPECT_EQ(runner_.seen("block-drain").runs, 2);
  EXPECT_TRUE(runner_.seen("block-drain").resume);
}

// A job whose runner ignores the interruption does not keep the daemon from stopping: after
// grace + interrupt_wait it is recorded QUEUED and the next daemon resumes it.
TEST_F(ServerTest, ShutdownEndsOnTimeWhenAJobIgnoresTheInterruption) {
  ServerOptions options = Options();
  options.shutdown_grace = absl::Milliseconds(300);
  options.scheduler.interrupt_wait = absl::Milliseconds(700);
  StartServer(options);
  const v1::Job job = MustSubmit(Consolidate("stuck-1"));
  ASSERT_TRUE(WaitForState(job.id(), v1::JOB_STATE_RUNNING));

  const absl::Time start = absl::Now();
  server_->Shutdown();
  server_->Wait();
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(950));
  EXPECT_LT(took, absl::Seconds(4));  // grace + interrupt_wait + gRPC's 2 s, with room
  {
    auto store = JobStore::Open(state_dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    auto jobs = (*store)->LoadAll();
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    ASSERT_EQ(jobs->size(), 1u);
    EXPECT_EQ((*jobs)[0].state(), v1::JOB_STATE_QUEUED);
  }
  // In-process, the destructor still joins the abandoned worker (reshardd exits instead).
  runner_.ReleaseAll();
  client_.reset();
  server_.reset();

  StartServer(Options());
  const v1::Job done = WatchToEnd(job.id());
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.attempts(), 2);
  EXPECT_TRUE(runner_.seen("stuck-1").resume);
}

// Inspect and Plan read inputs on the offload pool. Calls stuck there (e.g. in open() on a
// FIFO) must not starve later ones, and a call waits only until its deadline: its handler
// returns DEADLINE_EXCEEDED then, freeing the gRPC thread.
TEST_F(ServerTest, InspectAndPlanHonourDeadlinesWhileMetadataThreadsAreStuck) {
  ServerOptions options = Options();
  options.offload = {/*threads=*/1, /*max_threads=*/2, /*stuck_after=*/absl::Milliseconds(200)};
  StartServer(options);
  absl::Notification release;
  std::atomic<int> started{0};
  std::vector<std::thread> stuck;
  auto add_stuck_task = [&] {
    stuck.emplace_back([&] {
      server_->offload_pool()
          .Run(
              [&] {
                started.fetch_add(1);
                release.WaitForNotification();
              },
              absl::InfiniteFuture())
          .IgnoreError();
    });
  };
  auto wait_started = [&](int count) {
    const absl::Time deadline = absl::Now() + kWait;
    while (started.load() < count && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    return started.load() >= count;
  };

  // The only thread is stuck: once it has been for stuck_after, a thread is added.
  add_stuck_task();
  ASSERT_TRUE(wait_started(1));
  auto inspected = client_->Inspect(root_ + "/model.safetensors", "");
  ASSERT_TRUE(inspected.ok()) << inspected.status();
  EXPECT_EQ(inspected->tensors_size(), 1);

  // Both threads stuck and no more allowed (max_threads is 2): calls end at their deadline.
  add_stuck_task();
  ASSERT_TRUE(wait_started(2));
  EXPECT_EQ(server_->offload_pool().thread_count(), 2);
  auto stub = v1::Reshard::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    const absl::Time start = absl::Now();
    grpc::Status status;
    if (i == 2) {
      v1::PlanRequest request;
      *request.mutable_spec() = Consolidate("planned");
      v1::PlanResponse response;
      status = stub->Plan(&context, request, &response);
    } else {
      v1::InspectRequest request;
      request.set_input(root_ + "/model.safetensors");
      v1::InspectResponse response;
      status = stub->Inspect(&context, request, &response);
    }
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
    EXPECT_GE(took, absl::Milliseconds(900));
    EXPECT_LT(took, absl::Milliseconds(1800));
  }
  auto health = Health(server_->address());
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthStatus::SERVING);
  // The handlers returned (the client's deadline alone would not show that), with
  // DEADLINE_EXCEEDED or, when gRPC's cancellation of the expired call was seen first, CANCELLED.
  auto handled = [](const std::string& code) {
    return absl::StrCat(R"(grpc_server_handled_total{grpc_code=")", code,
                        R"(",grpc_method="Inspect",grpc_service="reshard.v1.Reshard",)"
                        R"(grpc_type="unary"})");
  };
  double ended = 0;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(5);
       ended < 2 && absl::Now() < deadline; absl::SleepFor(absl::Milliseconds(20))) {
    auto metrics = HttpGet(server_->metrics_address(), "/metrics");
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    ended = SampleValue(*metrics, handled("DeadlineExceeded")) +
            SampleValue(*metrics, handled("Canceled"));
  }
  EXPECT_EQ(ended, 2);

  release.Notify();
  for (std::thread& thread : stuck) thread.join();
  inspected = client_->Inspect(root_ + "/model.safetensors", "");
  EXPECT_TRUE(inspected.ok()) << inspected.status();
}

TEST_F(ServerTest, MetricsEndpoint) {
  StartServer(Options());
  ASSERT_FALSE(server_->metrics_address().empty());
  const std::string submitted = R"(reshard_jobs_submitted_total{kind="consolidate"})";
  const std::string succeeded =
      R"(reshard_jobs_finished_total{kind="consolidate",result="succeeded"})";
  auto before = HttpGet(server_->metrics_address(), "/metrics");
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(SampleValue(*before, submitted), 0) << *before;
  EXPECT_EQ(SampleValue(*before, succeeded), 0) << *before;
  EXPECT_EQ(SampleValue(*before, "reshard_memory_budget_bytes"), 1 << 20) << *before;

  const v1::Job job = MustSubmit(Consolidate("metered"));
  EXPECT_EQ(WatchToEnd(job.id()).state(), v1::JOB_STATE_SUCCEEDED);
  auto after = HttpGet(server_->metrics_address(), "/metrics");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(SampleValue(*after, submitted), 1) << *after;
  EXPECT_EQ(SampleValue(*after, R"(reshard_jobs_submitted_total{kind="reshard"})"), 0);
  EXPECT_EQ(SampleValue(*after, succeeded), 1) << *after;
  EXPECT_EQ(SampleValue(*after, "reshard_written_bytes_total"), 200) << *after;
  EXPECT_EQ(SampleValue(*after, "reshard_jobs_running"), 0) << *after;
  EXPECT_EQ(SampleValue(*after, "reshard_memory_reserved_bytes"), 0) << *after;
  EXPECT_NE(after->find("reshard_job_duration_seconds_bucket"), std::string::npos);
  // The rest of the set: phases, output counters, last success, build info, gRPC calls and
  // the process collector.
  EXPECT_EQ(SampleValue(*after, R"(reshard_job_phase_duration_seconds_count{phase="plan"})"), 1)
      << *after;
  EXPECT_EQ(SampleValue(*after, R"(reshard_job_phase_duration_seconds_count{phase="verify"})"), 0)
      << "verify is observed for resumed attempts only";
  EXPECT_EQ(SampleValue(*after, "reshard_tensors_written_total"), 1) << *after;
  EXPECT_EQ(SampleValue(*after, "reshard_files_written_total"), 1) << *after;
  EXPECT_EQ(SampleValue(*after, "reshard_job_peak_rss_bytes_count"), 1) << *after;
  EXPECT_EQ(SampleValue(*after, "reshard_verification_failures_total"), 0) << *after;
  EXPECT_GT(SampleValue(*after, R"(reshard_last_success_timestamp_seconds{kind="consolidate"})"),
            1e9)
      << *after;
  EXPECT_EQ(SampleValue(*after, R"(reshard_last_success_timestamp_seconds{kind="reshard"})"), 0);
  EXPECT_NE(after->find("reshard_build_info{"), std::string::npos) << *after;
  // gRPC series, labels in the exposition's (sorted) order.
  auto grpc = [](const std::string& name, const std::string& code, const std::string& method,
                 const std::string& type) {
    return absl::StrCat(name, "{", code.empty() ? "" : "grpc_code=\"" + code + "\",",
                        "grpc_method=\"", method, "\",grpc_service=\"reshard.v1.Reshard\",",
                        "grpc_type=\"", type, "\"}");
  };
  EXPECT_GE(SampleValue(*after, grpc("grpc_server_handled_total", "OK", "SubmitJob", "unary")), 1)
      << *after;
  EXPECT_EQ(SampleValue(*after, grpc("grpc_server_handled_total", "NotFound", "GetJob", "unary")),
            0)
      << *after;
  EXPECT_GE(SampleValue(*after, grpc("grpc_server_started_total", "", "WatchJob", "server_stream")),
            1)
      << *after;
  EXPECT_GT(SampleValue(*after, "process_resident_memory_bytes"), 0) << *after;
  EXPECT_GT(SampleValue(*after, "process_open_fds"), 0) << *after;
  EXPECT_GT(SampleValue(*after, "process_threads"), 1) << *after;
}

TEST(ServerStartTest, BadOptionsAreRefused) {
  ServerOptions options;
  options.allowed_roots = {testing::TempDir()};
  EXPECT_EQ(Server::Start(options).status().code(), absl::StatusCode::kInvalidArgument)
      << "no state dir";
  options.state_dir = MakeTempDir("server_state");
  options.allowed_roots = {};
  EXPECT_FALSE(Server::Start(options).ok()) << "no allowed root";
  options.allowed_roots = {testing::TempDir() + "/no-such-root"};
  EXPECT_FALSE(Server::Start(options).ok()) << "missing allowed root";
}

}  // namespace
}  // namespace reshard

namespace reshard {
namespace {

// A second daemon on a port already in use must fail to start, not share the port (gRPC sets
// SO_REUSEPORT by default, which would silently split clients between two daemons).
TEST(ServerStartTest, PortInUseIsRefused) {
  const std::string base = MakeTempDir("server_port");
  fs::create_directories(base + "/root");
  ServerOptions options;
  options.state_dir = base + "/state1";
  options.allowed_roots = {base + "/root"};
  options.shutdown_grace = absl::ZeroDuration();
  auto first = Server::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  options.listen = (*first)->address();
  options.state_dir = base + "/state2";
  auto second = Server::Start(options);
  EXPECT_FALSE(second.ok()) << "a second server started on " << options.listen;
  if (!second.ok()) {
    EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  }
}

}  // namespace
}  // namespace reshard
