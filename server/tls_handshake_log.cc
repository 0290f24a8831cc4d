#include "server/tls_handshake_log.h"

#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/base/const_init.h"
#include "absl/strings/match.h"

// gRPC's own output (timestamp, thread, file:line, message on stderr). Exported by libgpr
// without a public declaration; gpr_set_log_function(gpr_default_log) is what gRPC does at
// start.
void gpr_default_log(gpr_log_func_args* args);

namespace reshard {
namespace {

ABSL_CONST_INIT absl::Mutex installed_mu(absl::kConstInit);
TlsHandshakeLog* installed ABSL_GUARDED_BY(installed_mu) = nullptr;

}  // namespace

TlsHandshakeLog::TlsHandshakeLog(absl::Duration interval, std::function<void()> count)
    : interval_(interval), count_(std::move(count)) {
  summarizer_ = std::thread([this] { Run(); });
  absl::MutexLock lock(&installed_mu);
  installed = this;
  gpr_set_log_function(&TlsHandshakeLog::Route);
}

TlsHandshakeLog::~TlsHandshakeLog() {
  {
    absl::MutexLock lock(&installed_mu);
    if (installed == this) {
      installed = nullptr;
      gpr_set_log_function(gpr_default_log);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  summarizer_.join();
}

bool TlsHandshakeLog::IsHandshakeFailure(const gpr_log_func_args& line) {
  return line.severity == GPR_LOG_SEVERITY_ERROR && line.file != nullptr &&
         line.message != nullptr && absl::EndsWith(line.file, "ssl_transport_security.cc") &&
         absl::StartsWith(line.message, "Handshake failed");
}

void TlsHandshakeLog::Route(gpr_log_func_args* line) {
  if (IsHandshakeFailure(*line)) {
    absl::MutexLock lock(&installed_mu);
    if (installed != nullptr) {
      installed->Failed(line->message);
      return;
    }
  }
  gpr_default_log(line);
}

void TlsHandshakeLog::Failed(absl::string_view reason) {
  count_();
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (pending_ == 0 && now - last_line_ >= interval_) {
    std::fprintf(stderr,
                 "reshardd: a TLS handshake failed (%.*s); failures in the next %g s are "
                 "summarized in one line\n",
                 static_cast<int>(reason.size()), reason.data(),
                 absl::ToDoubleSeconds(interval_));
    std::fflush(stderr);
    last_line_ = now;
    return;
  }
  ++pending_;
  last_reason_ = std::string(reason);
}

void TlsHandshakeLog::WriteSummary() {
  const absl::Time now = absl::Now();
  if (pending_ > 0) {
    const int64_t seconds =
        static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(now - last_line_)));
    std::fprintf(stderr, "reshardd: %lld more TLS handshake%s failed in the last %lld s (the "
                         "last: %s)\n",
                 static_cast<long long>(pending_), pending_ == 1 ? "" : "s",
                 static_cast<long long>(seconds), last_reason_.c_str());
    std::fflush(stderr);
    last_line_ = now;
  }
  pending_ = 0;
}

void TlsHandshakeLog::Flush() {
  absl::MutexLock lock(&mu_);
  WriteSummary();
}

void TlsHandshakeLog::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(this, &TlsHandshakeLog::HasWork));
    if (!stop_) mu_.AwaitWithDeadline(absl::Condition(&stop_), last_line_ + interval_);
    WriteSummary();
    if (stop_) return;
  }
}

}  // namespace reshard
