#include "client/client.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lib/testing/test_files.h"
#include "proto/reshard/v1/reshard.grpc.pb.h"
#include "server/job_store.h"
#include "server/scheduler.h"
#include "server/server.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

// A loopback port that was free a moment ago.
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  ::close(fd);
  return ntohs(address.sin_port);
}

std::unique_ptr<Client> MustConnect(const std::string& address, int max_attempts,
                                    absl::Duration backoff, absl::Duration max_backoff) {
  ClientOptions options;
  options.address = address;
  options.rpc_timeout = absl::Seconds(5);
  options.max_attempts = max_attempts;
  options.initial_backoff = backoff;
  options.max_backoff = max_backoff;
  options.watch_reconnect_limit = absl::Seconds(15);
  auto client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

v1::JobSpec SomeSpec() {
  v1::JobSpec spec;
  spec.set_kind(v1::JOB_KIND_CONSOLIDATE);
  spec.set_input("/data/in");
  spec.set_output("/data/out");
  return spec;
}

// Answers every call with UNAVAILABLE (the id "missing" with NOT_FOUND) and counts them.
class UnavailableService final : public v1::Reshard::Service {
 public:
  std::atomic<int> calls{0};

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::Job*) override {
    return Answer("");
  }
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request, v1::Job*) override {
    return Answer(request->id());
  }
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse*) override {
    return Answer("");
  }
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                         v1::Job*) override {
    return Answer(request->id());
  }
  grpc::Status Plan(grpc::ServerContext*, const v1::PlanRequest*, v1::PlanResponse*) override {
    return Answer("");
  }
  grpc::Status Inspect(grpc::ServerContext*, const v1::InspectRequest*,
                       v1::InspectResponse*) override {
    return Answer("");
  }

 private:
  grpc::Status Answer(const std::string& id) {
    ++calls;
    if (id == "missing") return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining");
  }
};

class ClientRetryTest : public testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    client_ = MustConnect(absl::StrCat("127.0.0.1:", port), 3, absl::Milliseconds(20),
                          absl::Milliseconds(100));
    ASSERT_NE(client_, nullptr);
  }
  void TearDown() override {
    client_.reset();
    server_->Shutdown();
  }

  // Calls made by `call`.
  template <typename F>
  int Calls(F call) {
    const int before = service_.calls.load();
    call();
    return service_.calls.load() - before;
  }

  UnavailableService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientRetryTest, IdempotentCallsAreRetriedOnUnavailable) {
  EXPECT_EQ(Calls([&] {
              EXPECT_EQ(client_->Get("j-1").status().code(), absl::StatusCode::kUnavailable);
            }),
            3);
  EXPECT_EQ(Calls([&] {
              EXPECT_EQ(client_->List({}, 0, "").status().code(), absl::StatusCode::kUnavailable);
            }),
            3);
  EXPECT_EQ(Calls([&] {
              EXPECT_EQ(client_->Cancel("j-1").status().code(), absl::StatusCode::kUnavailable);
            }),
            3);
  EXPECT_EQ(Calls([&] {
              EXPECT_EQ(client_->Plan(SomeSpec()).status().code(), absl::StatusCode::kUnavailable);
            }),
            3);
  EXPECT_EQ(Calls([&] {
              EXPECT_EQ(client_->Inspect("/data/in", "").status().code(),
                        absl::StatusCode::kUnavailable);
            }),
            3);
}

TEST_F(ClientRetryTest, SubmitIsRetriedOnlyWithAnIdempotencyKey) {
  EXPECT_EQ(Calls([&] {
              EXPECT_EQ(client_->Submit(SomeSpec(), "").status().code(),
                        absl::StatusCode::kUnavailable);
            }),
            1);
  EXPECT_EQ(Calls([&] {
              EXPECT_EQ(client_->Submit(SomeSpec(), "key").status().code(),
                        absl::StatusCode::kUnavailable);
            }),
            3);
}

TEST_F(ClientRetryTest, OtherErrorsAreNotRetried) {
  EXPECT_EQ(Calls([&] {
              EXPECT_EQ(client_->Get("missing").status().code(), absl::StatusCode::kNotFound);
            }),
            1);
  EXPECT_EQ(Calls([&] {
              EXPECT_EQ(client_->Cancel("missing").status().code(), absl::StatusCode::kNotFound);
            }),
            1);
}

TEST(ClientTest, ConnectNeedsAnAddress) {
  EXPECT_EQ(Client::Connect(ClientOptions()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClientTest, NothingListeningIsUnavailableAfterBackoffs) {
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  const absl::Duration backoff = absl::Milliseconds(150);
  auto client = MustConnect(address, 3, backoff, absl::Seconds(2));
  ASSERT_NE(client, nullptr);

  absl::Time start = absl::Now();
  auto job = client->Get("j-1");
  const absl::Duration get_elapsed = absl::Now() - start;
  EXPECT_EQ(job.status().code(), absl::StatusCode::kUnavailable) << job.status();
  EXPECT_NE(job.status().message().find(address), absl::string_view::npos) << job.status();
  // Three attempts: two backoffs (150 ms, then 300 ms) in between, and no third one.
  EXPECT_GE(get_elapsed, backoff + 2 * backoff) << get_elapsed;
  EXPECT_LT(get_elapsed, absl::Seconds(4)) << get_elapsed;

  start = absl::Now();
  auto submitted = client->Submit(SomeSpec(), "");
  const absl::Duration submit_elapsed = absl::Now() - start;
  EXPECT_EQ(submitted.status().code(), absl::StatusCode::kUnavailable) << submitted.status();
  EXPECT_LT(submit_elapsed, backoff) << "Submit without a key must not be retried";
}

// A trivial runner for the real server below.
absl::StatusOr<ConversionResult> InstantRunner(const v1::Job& job, JobContext&) {
  ConversionResult result;
  result.output = job.spec().output();
  return result;
}

TEST(ClientTest, RetriesUntilTheServerComesUp) {
  const std::string base = MakeTempDir("client");
  const std::string state_dir = base + "/state";
  const std::string root = base + "/root";
  fs::create_directories(root);
  {
    // A job the daemon will know about once it is up.
    auto store = JobStore::Open(state_dir);
    ASSERT_TRUE(store.ok()) << store.status();
    v1::Job job;
    job.set_id("j-known");
    *job.mutable_spec() = SomeSpec();
    job.set_state(v1::JOB_STATE_SUCCEEDED);
    job.set_created_unix(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
    job.set_finished_unix(job.created_unix());
    ASSERT_TRUE((*store)->Put(job).ok());
  }
  const int port = FreePort();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto client = MustConnect(address, 12, absl::Milliseconds(100), absl::Milliseconds(500));
  ASSERT_NE(client, nullptr);

  const absl::Duration delay = absl::Milliseconds(300);
  std::unique_ptr<Server> server;
  absl::Status started;
  std::thread starter([&] {
    absl::SleepFor(delay);
    ServerOptions options;
    options.listen = address;
    options.state_dir = state_dir;
    options.allowed_roots = {root};
    options.shutdown_grace = absl::ZeroDuration();
    options.runner = InstantRunner;
    options.estimator = [](const v1::JobSpec&) -> uint64_t { return 1; };
    auto made = Server::Start(options);
    started = made.status();
    if (made.ok()) server = *std::move(made);
  });
  const absl::Time start = absl::Now();
  auto job = client->Get("j-known");
  const absl::Duration elapsed = absl::Now() - start;
  starter.join();
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id(), "j-known");
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_GE(elapsed, delay - absl::Milliseconds(50)) << "answered before the server was up?";
  EXPECT_EQ(server->address(), address);
}

// Watch follows a job across a daemon restart on the same address and state dir.
TEST(ClientTest, WatchReconnectsAcrossARestart) {
  const std::string base = MakeTempDir("client_watch");
  const std::string root = base + "/root";
  fs::create_directories(root);
  std::ofstream(root + "/in.safetensors") << "not read by the fake runner";
  std::atomic<bool> block{true};
  std::atomic<int> runs{0};
  std::atomic<bool> resumed{false};
  ServerOptions options;
  options.listen = absl::StrCat("127.0.0.1:", FreePort());
  options.state_dir = base + "/state";
  options.allowed_roots = {root};
  options.shutdown_grace = absl::ZeroDuration();
  options.estimator = [](const v1::JobSpec&) -> uint64_t { return 1; };
  options.runner = [&](const v1::Job& job,
                       JobContext& context) -> absl::StatusOr<ConversionResult> {
    ++runs;
    resumed.store(context.resume);
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (block.load() && !context.cancelled.load() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    if (context.cancelled.load()) return absl::CancelledError("interrupted");
    ConversionResult result;
    result.output = job.spec().output();
    return result;
  };
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = MustConnect(options.listen, 3, absl::Milliseconds(50), absl::Milliseconds(300));
  ASSERT_NE(client, nullptr);
  v1::JobSpec spec;
  spec.set_kind(v1::JOB_KIND_CONSOLIDATE);
  spec.set_input(root + "/in.safetensors");
  spec.set_output(root + "/out");
  auto job = client->Submit(spec, "watch-key");
  ASSERT_TRUE(job.ok()) << job.status();

  std::atomic<bool> saw_running{false};
  absl::StatusOr<v1::Job> watched = absl::UnknownError("not run");
  std::thread watcher([&] {
    watched = client->Watch(job->id(), [&](const v1::Job& event) {
      if (event.state() == v1::JOB_STATE_RUNNING) saw_running.store(true);
    });
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!saw_running.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(saw_running.load());

  (*server)->Shutdown();
  server->reset();
  block.store(false);
  auto restarted = Server::Start(options);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  watcher.join();
  ASSERT_TRUE(watched.ok()) << watched.status();
  EXPECT_EQ(watched->id(), job->id());
  EXPECT_EQ(watched->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(runs.load(), 2);
  EXPECT_TRUE(resumed.load());
}

TEST(ClientTest, WatchStopsWhenAsked) {
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  auto client = MustConnect(address, 3, absl::Milliseconds(50), absl::Milliseconds(100));
  ASSERT_NE(client, nullptr);
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(200));
    stop.store(true);
  });
  const absl::Time start = absl::Now();
  auto watched = client->Watch("j-1", nullptr, &stop);
  stopper.join();
  EXPECT_EQ(watched.status().code(), absl::StatusCode::kCancelled) << watched.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace reshard
