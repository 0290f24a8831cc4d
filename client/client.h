// The C++ client of reshardd: Submit/Get/List/Cancel/Watch/Plan/Inspect with deadlines and
// retries. Idempotent calls are retried on UNAVAILABLE with exponential backoff; Submit only
// when it carries an idempotency key (then a retry cannot create a second job). Watch follows a
// job to its end and reconnects across daemon restarts. Thread safe.

#ifndef RESHARD_CLIENT_CLIENT_H_
#define RESHARD_CLIENT_CLIENT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/reshard/v1/reshard.grpc.pb.h"

namespace reshard {

struct ClientOptions {
  std::string address;  // "host:port"
  // TLS: the CA certificates (PEM file) the daemon's certificate must be signed by; with
  // tls_cert and tls_key (PEM files), also a client certificate for mutual TLS. All empty:
  // plaintext.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  // Bearer token sent as `authorization: Bearer TOKEN` on every call; empty: none.
  std::string token;
  // Deadline of each unary call. Default: 60 s.
  absl::Duration rpc_timeout = absl::Seconds(60);
  // Attempts of a retried call, and the backoff between them (doubling up to max_backoff).
  int max_attempts = 6;
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(5);
  // How long Watch keeps reconnecting to a daemon that is down. Default: 10 minutes.
  absl::Duration watch_reconnect_limit = absl::Minutes(10);
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, const std::string& idempotency_key);
  absl::StatusOr<v1::Job> Get(const std::string& id);
  absl::StatusOr<v1::ListJobsResponse> List(const std::vector<v1::JobState>& states, int page_size,
                                            const std::string& page_token);
  absl::StatusOr<v1::Job> Cancel(const std::string& id);
  absl::StatusOr<v1::PlanResponse> Plan(const v1::JobSpec& spec);
  absl::StatusOr<v1::InspectResponse> Inspect(const std::string& input,
                                              const std::string& rules_json,
                                              const std::string& tag = "",
                                              bool include_optimizer = false);

  // Calls `on_event` for every state the daemon reports until the job is finished, and
  // returns the final job. Stops early with Cancelled when `*stop` becomes true.
  absl::StatusOr<v1::Job> Watch(const std::string& id,
                                const std::function<void(const v1::Job&)>& on_event,
                                const std::atomic<bool>* stop = nullptr);

 private:
  Client(ClientOptions options, std::unique_ptr<v1::Reshard::Stub> stub)
      : options_(std::move(options)), stub_(std::move(stub)) {}

  // Deadline-free context setup shared by every call: the bearer token.
  void Authorize(grpc::ClientContext* context) const;
  // Runs `call` with a fresh context per attempt, retrying UNAVAILABLE when `retry`.
  absl::Status Call(bool retry, const std::function<grpc::Status(grpc::ClientContext*)>& call);

  const ClientOptions options_;
  std::unique_ptr<v1::Reshard::Stub> stub_;
};

}  // namespace reshard

#endif  // RESHARD_CLIENT_CLIENT_H_
