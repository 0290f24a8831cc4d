// Keeps failed TLS handshakes from flooding reshardd's stderr.
//
// gRPC core logs one line per failed handshake ("Handshake failed with fatal error ..." from
// ssl_transport_security.cc), so any peer that reaches the port can fill the log by sending
// bytes that are not TLS. TlsHandshakeLog routes gRPC's log lines: handshake failures are
// counted (`count`, reshard_tls_handshake_failures_total) and logged at most once per
// interval: the first failure after a quiet interval at once, the others in one summary line
// ("N more TLS handshakes failed in the last S s (the last: REASON)") when the interval ends
// or the log is stopped. Every other line goes to gRPC's own output unchanged. gRPC filters
// by GRPC_VERBOSITY before it calls a log function, so failures are counted unless
// GRPC_VERBOSITY=NONE.
//
// gRPC has one log function per process: the latest TlsHandshakeLog routes it, and gRPC's
// default output returns when that one is destroyed. gRPC does not tell the log function the
// peer's address, so the lines name the reason only.

#ifndef RESHARD_SERVER_TLS_HANDSHAKE_LOG_H_
#define RESHARD_SERVER_TLS_HANDSHAKE_LOG_H_

#include <grpc/support/log.h>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace reshard {

class TlsHandshakeLog {
 public:
  // Installs itself as gRPC's log function. `count` is called once per failed handshake.
  TlsHandshakeLog(absl::Duration interval, std::function<void()> count);
  // Writes the pending summary and gives gRPC its default output back.
  ~TlsHandshakeLog();

  TlsHandshakeLog(const TlsHandshakeLog&) = delete;
  TlsHandshakeLog& operator=(const TlsHandshakeLog&) = delete;

  // Writes the summary of the failures not logged yet (if any) now.
  void Flush();

  // Whether gRPC's line reports a failed TLS handshake.
  static bool IsHandshakeFailure(const gpr_log_func_args& line);

 private:
  static void Route(gpr_log_func_args* line);
  void Failed(absl::string_view reason);
  // Writes the summary of `pending_` failures and starts a new interval.
  void WriteSummary() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || pending_ > 0; }
  // Writes each pending summary when its interval ends.
  void Run();

  const absl::Duration interval_;
  const std::function<void()> count_;
  absl::Mutex mu_;
  // When the last line was written; the next one waits until interval_ after it.
  absl::Time last_line_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;  // failures since the last line
  std::string last_reason_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread summarizer_;
};

}  // namespace reshard

#endif  // RESHARD_SERVER_TLS_HANDSHAKE_LOG_H_
