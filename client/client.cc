#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/io/file_access.h"
#include "proto/reshard/v1/rpc_status.h"

namespace reshard {
namespace {

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return;
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
}

// Plaintext without TLS files; else TLS (with a client certificate when given).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const ClientOptions& options) {
  if (options.tls_ca.empty() && options.tls_cert.empty() && options.tls_key.empty()) {
    return grpc::InsecureChannelCredentials();
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  constexpr uint64_t kMaxPemBytes = 1 << 20;
  grpc::SslCredentialsOptions ssl;
  const std::pair<const std::string*, std::string*> files[] = {
      {&options.tls_ca, &ssl.pem_root_certs},
      {&options.tls_cert, &ssl.pem_cert_chain},
      {&options.tls_key, &ssl.pem_private_key}};
  for (const auto& [path, pem] : files) {
    if (path->empty()) continue;
    ASSIGN_OR_RETURN(*pem, ReadSmallFile(*path, kMaxPemBytes), "reading a TLS file");
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.address.empty()) return absl::InvalidArgumentError("no daemon address given");
  if (options.token.find_first_of("\r\n") != std::string::npos) {
    return absl::InvalidArgumentError("the bearer token holds a line break");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   ChannelCredentials(options));
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
  auto channel = grpc::CreateCustomChannel(options.address, credentials, arguments);
  return std::unique_ptr<Client>(new Client(options, v1::Reshard::NewStub(channel)));
}

void Client::Authorize(grpc::ClientContext* context) const {
  if (!options_.token.empty()) context->AddMetadata("authorization", "Bearer " + options_.token);
}

absl::Status Client::Call(bool retry,
                          const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  absl::Duration backoff = options_.initial_backoff;
  absl::Status status;
  for (int attempt = 1; attempt <= std::max(1, options_.max_attempts); ++attempt) {
    grpc::ClientContext context;
    SetDeadline(&context, options_.rpc_timeout);
    Authorize(&context);
    status = StatusFromRpc(call(&context), context);
    if (!absl::IsUnavailable(status) || !retry) break;
    if (attempt < options_.max_attempts) {
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
  }
  if (absl::IsUnavailable(status)) {
    return absl::UnavailableError(
        absl::StrCat("reshardd at ", options_.address, " is unavailable: ", status.message()));
  }
  return status;
}

absl::StatusOr<v1::Job> Client::Submit(const v1::JobSpec& spec,
                                       const std::string& idempotency_key) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  request.set_idempotency_key(idempotency_key);
  v1::Job job;
  absl::Status status = Call(!idempotency_key.empty(), [&](grpc::ClientContext* context) {
    return stub_->SubmitJob(context, request, &job);
  });
  if (!status.ok()) return status;
  return job;
}

absl::StatusOr<v1::Job> Client::Get(const std::string& id) {
  v1::GetJobRequest request;
  request.set_id(id);
  v1::Job job;
  absl::Status status = Call(
      true, [&](grpc::ClientContext* context) { return stub_->GetJob(context, request, &job); });
  if (!status.ok()) return status;
  return job;
}

absl::StatusOr<v1::ListJobsResponse> Client::List(const std::vector<v1::JobState>& states,
                                                  int page_size, const std::string& page_token) {
  v1::ListJobsRequest request;
  for (v1::JobState state : states) request.add_states(state);
  request.set_page_size(page_size);
  request.set_page_token(page_token);
  v1::ListJobsResponse response;
  absl::Status status = Call(true, [&](grpc::ClientContext* context) {
    return stub_->ListJobs(context, request, &response);
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::Job> Client::Cancel(const std::string& id) {
  v1::CancelJobRequest request;
  request.set_id(id);
  v1::Job job;
  absl::Status status = Call(
      true, [&](grpc::ClientContext* context) { return stub_->CancelJob(context, request, &job); });
  if (!status.ok()) return status;
  return job;
}

absl::StatusOr<v1::PlanResponse> Client::Plan(const v1::JobSpec& spec) {
  v1::PlanRequest request;
  *request.mutable_spec() = spec;
  v1::PlanResponse response;
  absl::Status status = Call(
      true, [&](grpc::ClientContext* context) { return stub_->Plan(context, request, &response); });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::InspectResponse> Client::Inspect(const std::string& input,
                                                    const std::string& rules_json,
                                                    const std::string& tag,
                                                    bool include_optimizer) {
  v1::InspectRequest request;
  request.set_input(input);
  request.set_rules_json(rules_json);
  request.set_tag(tag);
  request.set_include_optimizer(include_optimizer);
  v1::InspectResponse response;
  absl::Status status = Call(true, [&](grpc::ClientContext* context) {
    return stub_->Inspect(context, request, &response);
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::Job> Client::Watch(const std::string& id,
                                      const std::function<void(const v1::Job&)>& on_event,
                                      const std::atomic<bool>* stop) {
  v1::WatchJobRequest request;
  request.set_id(id);
  absl::Time unreachable_since = absl::InfiniteFuture();
  absl::Duration backoff = options_.initial_backoff;
  while (true) {
    if (stop != nullptr && stop->load()) return absl::CancelledError("stopped watching");
    grpc::ClientContext context;  // no deadline: jobs can run for hours
    Authorize(&context);
    std::atomic<bool> finished{false};
    // Cancels the stream when asked to stop.
    std::thread stopper([&] {
      while (!finished.load()) {
        if (stop != nullptr && stop->load()) {
          context.TryCancel();
          return;
        }
        absl::SleepFor(absl::Milliseconds(100));
      }
    });
    auto reader = stub_->WatchJob(&context, request);
    v1::JobEvent event;
    v1::Job last;
    bool got_event = false;
    while (reader->Read(&event)) {
      got_event = true;
      last = event.job();
      unreachable_since = absl::InfiniteFuture();
      backoff = options_.initial_backoff;
      if (on_event) on_event(last);
    }
    absl::Status status = StatusFromRpc(reader->Finish(), context);
    finished.store(true);
    stopper.join();
    if (got_event &&
        (last.state() == v1::JOB_STATE_SUCCEEDED || last.state() == v1::JOB_STATE_FAILED ||
         last.state() == v1::JOB_STATE_CANCELLED)) {
      return last;
    }
    if (stop != nullptr && stop->load()) return absl::CancelledError("stopped watching");
    if (!status.ok() && !absl::IsUnavailable(status)) return status;
    // The daemon went away (restart, drain): reconnect, within a limit.
    const absl::Time now = absl::Now();
    if (unreachable_since == absl::InfiniteFuture()) unreachable_since = now;
    if (now - unreachable_since > options_.watch_reconnect_limit) {
      return absl::UnavailableError(absl::StrCat("lost reshardd at ", options_.address,
                                                 " while watching job ", id, ": ",
                                                 status.message()));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

}  // namespace reshard
