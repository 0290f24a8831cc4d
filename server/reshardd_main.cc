// reshardd: the reshard conversion daemon.
//
//   bazel build //server:reshardd
//   bazel-bin/server/reshardd --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:9464
//       --state-dir /var/lib/reshard --allowed-root /data/checkpoints --memory-budget 16GiB
//   (one command line)
//
// Prints "listening on HOST:PORT" (and "metrics on HOST:PORT") on stdout once serving.
// SIGHUP reloads the TLS certificates and the token file (see docs/operations.md, Security).
// SIGTERM/SIGINT drain it (see Server::Shutdown) and it exits 0 within about
// --shutdown-grace + --shutdown-interrupt-wait + 2 s, whatever a job or request is doing.

#include <signal.h>
#include <time.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "lib/plan/layout_builders.h"
#include "server/server.h"

int main(int argc, char** argv) {
  using namespace reshard;
  CLI::App app{"reshardd: the reshard checkpoint conversion daemon"};
  ServerOptions options;
  std::string memory_budget = "8GiB";
  std::string retention = "168h";
  int grace_seconds = 30;
  int interrupt_wait_seconds = 5;
  app.add_option("--listen", options.listen, "gRPC address (port 0 picks a free one)")
      ->capture_default_str();
  app.add_option("--metrics-listen", options.metrics_listen,
                 "Prometheus /metrics address (empty: off)");
  app.add_option("--state-dir", options.state_dir, "job store folder")->required();
  app.add_option("--allowed-root", options.allowed_roots,
                 "folder or s3://bucket/prefix jobs may read and write (repeatable)")
      ->required();
  app.add_option("--memory-budget", memory_budget,
                 "memory shared by running jobs and Inspect/Plan metadata")
      ->capture_default_str();
  app.add_option("--max-concurrent-jobs", options.scheduler.max_concurrent_jobs)
      ->capture_default_str();
  app.add_option("--max-queue", options.scheduler.max_queue, "queued jobs at most")
      ->capture_default_str();
  app.add_option("--shutdown-grace", grace_seconds, "seconds running jobs get on SIGTERM")
      ->capture_default_str();
  app.add_option("--shutdown-interrupt-wait", interrupt_wait_seconds,
                 "seconds interrupted jobs get after the grace; then the daemon exits without "
                 "them and they resume at the next start")
      ->capture_default_str();
  app.add_option("--max-attempts", options.scheduler.max_attempts,
                 "attempts a job gets across daemon crashes before it fails")
      ->capture_default_str();
  app.add_option("--retention", retention, "how long finished jobs are kept (e.g. 168h, 30m)")
      ->capture_default_str();
  app.add_option("--tls-cert", options.tls.cert, "PEM certificate chain: serve gRPC over TLS");
  app.add_option("--tls-key", options.tls.key, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", options.tls.client_ca,
                 "PEM CA certificates: require client certificates signed by them (mTLS)");
  app.add_option("--auth-tokens", options.auth_tokens,
                 "JSON file of bearer tokens (mode 0600): scopes and roots per token");
  CLI11_PARSE(app, argc, argv);

  auto budget = ParseByteSize(memory_budget);
  absl::Duration keep;
  if (!budget.ok() || !absl::ParseDuration(retention, &keep) ||
      options.scheduler.max_concurrent_jobs < 1 || options.scheduler.max_queue < 1 ||
      grace_seconds < 0 || interrupt_wait_seconds < 0 || options.scheduler.max_attempts < 1) {
    std::cerr << "reshardd: invalid --memory-budget, --retention, --max-concurrent-jobs, "
                 "--max-queue, --shutdown-grace, --shutdown-interrupt-wait or --max-attempts\n";
    return 2;
  }
  options.scheduler.memory_budget = *budget;
  options.scheduler.retention = keep;
  options.shutdown_grace = absl::Seconds(grace_seconds);
  options.scheduler.interrupt_wait = absl::Seconds(interrupt_wait_seconds);

  // Signals are taken synchronously by one thread; every other thread blocks them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = Server::Start(options);
  if (!server.ok()) {
    std::cerr << "reshardd: " << server.status().message() << "\n";
    return 1;
  }
  std::cout << "listening on " << (*server)->address() << std::endl;
  if (!(*server)->metrics_address().empty()) {
    std::cout << "metrics on " << (*server)->metrics_address() << std::endl;
  }
  // Waits in short slices so that it also ends when the server stops for another reason.
  std::atomic<bool> stopped{false};
  std::thread signal_waiter([&] {
    const timespec slice{0, 200 * 1000 * 1000};
    while (!stopped.load()) {
      const int signal = sigtimedwait(&signals, nullptr, &slice);
      if (signal < 0) continue;  // EAGAIN: the slice passed; EINTR
      if (signal == SIGHUP) {
        const absl::Status reloaded = (*server)->Reload();
        if (reloaded.ok()) {
          std::cerr << "reshardd: SIGHUP: reloaded certificates and tokens\n";
        } else {
          std::cerr << "reshardd: SIGHUP: " << reloaded.message() << "\n";
        }
        continue;
      }
      std::cerr << "reshardd: signal " << signal << ", draining (grace " << grace_seconds << "s)\n";
      (*server)->Shutdown();
      return;
    }
  });
  (*server)->Wait();
  stopped.store(true);
  signal_waiter.join();
  std::cerr << "reshardd: stopped\n";
  // Exit without destructors: a job's worker the scheduler abandoned, or an Inspect/Plan task
  // stuck in a system call, would block the joins in their destructors. Nothing is lost: every
  // job record is durable once written (SQLite, synchronous=FULL), and the records of abandoned
  // jobs were written QUEUED by Scheduler::Shutdown.
  std::cout.flush();
  std::cerr.flush();
  std::_Exit(0);
}
