// reshardd as an object: Options in, a running server out. main() only parses flags into
// ServerOptions, starts the Server and waits for a signal; tests start it in-process on
// ephemeral loopback ports.

#ifndef RESHARD_SERVER_SERVER_H_
#define RESHARD_SERVER_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/offload_pool.h"
#include "server/scheduler.h"
#include "server/tls_credentials.h"

namespace reshard {

struct ServerOptions {
  // gRPC address; port 0 picks a free port (see Server::address). Default: 127.0.0.1:0.
  std::string listen = "127.0.0.1:0";
  // Prometheus /metrics address; empty disables it. Port 0 picks a free port.
  std::string metrics_listen;
  // Folder of the job store (created if needed). Required.
  std::string state_dir;
  // The only folders jobs may read and write. At least one is required.
  std::vector<std::string> allowed_roots;
  // TLS (cert + key) and mutual TLS (client_ca) on the gRPC port; all empty: plaintext.
  // The checked copies live in <state_dir>/tls.
  TlsFiles tls;
  // Bearer tokens (server/auth_tokens.h); empty: every caller may do everything.
  std::string auth_tokens;
  SchedulerOptions scheduler;
  // How long running jobs may go on after a shutdown request before they are interrupted.
  absl::Duration shutdown_grace = absl::Seconds(30);
  // The threads Inspect and Plan read inputs on.
  OffloadPool::Options offload;
  // Injected in tests; default: the engine.
  JobRunner runner;
  MemoryEstimator estimator;
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options);
  ~Server();

  // "host:port" actually bound.
  const std::string& address() const { return address_; }
  // "host:port" of /metrics, empty when disabled.
  const std::string& metrics_address() const { return metrics_address_; }
  Scheduler& scheduler() { return *scheduler_; }
  // Tests fill it with blocked tasks.
  OffloadPool& offload_pool();

  // Re-reads the TLS files and the token file (SIGHUP). Each part that fails to load keeps
  // its previous contents; the error names the file.
  absl::Status Reload();

  // Drains: health NOT_SERVING, new submissions refused, running jobs get the grace period,
  // then are interrupted to resume at the next start; then the gRPC server stops. Idempotent.
  void Shutdown();
  // Blocks until the gRPC server has stopped.
  void Wait();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  std::string address_;
  std::string metrics_address_;
  Scheduler* scheduler_ = nullptr;
};

}  // namespace reshard

#endif  // RESHARD_SERVER_SERVER_H_
