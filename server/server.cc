#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <exception>
#include <iostream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/core/status.h"
#include "prometheus/exposer.h"
#include "server/auth_tokens.h"
#include "server/grpc_metrics.h"
#include "server/job_runner.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/offload_pool.h"
#include "server/path_policy.h"
#include "server/process_collector.h"
#include "server/s3_collector.h"
#include "server/service.h"
#include "server/tls_credentials.h"
#include "server/tls_handshake_log.h"

namespace reshard {

namespace {

// Failed TLS handshakes are logged at most once per this interval (TlsHandshakeLog).
constexpr absl::Duration kHandshakeLogInterval = absl::Seconds(60);

bool IsLoopbackHost(const std::string& listen) {
  const std::string host = listen.substr(0, listen.rfind(':'));
  return host == "localhost" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

// Anyone who reaches the port may submit jobs that read and write under every root.
void WarnIfExposed(const ServerOptions& options) {
  if (IsLoopbackHost(options.listen)) return;
  if (options.tls.enabled() && !options.auth_tokens.empty()) return;
  std::cerr << "reshardd: warning: listening on " << options.listen << " beyond loopback"
            << (options.tls.enabled() ? "" : " without TLS (--tls-cert, --tls-key)")
            << (options.tls.enabled() || !options.auth_tokens.empty() ? "" : " and")
            << (options.auth_tokens.empty() ? " without bearer tokens (--auth-tokens)" : "")
            << ": whoever reaches the port can read and write under every --allowed-root\n";
}

}  // namespace

struct Server::Impl {
  ServerOptions options;
  std::unique_ptr<JobStore> store;
  Metrics metrics;
  GrpcServerMetrics grpc_metrics{*metrics.registry(), {"reshard.v1.Reshard"}};
  // Its idle baseline (reshard_memory_in_use_bytes) is taken once the server is serving.
  std::shared_ptr<ProcessCollector> process_metrics = std::make_shared<ProcessCollector>();
  std::shared_ptr<S3Collector> s3_metrics = std::make_shared<S3Collector>();
  std::unique_ptr<prometheus::Exposer> exposer;
  std::unique_ptr<PathPolicy> paths;
  std::unique_ptr<ServerTls> tls;
  std::unique_ptr<TlsHandshakeLog> handshake_log;
  std::unique_ptr<Authorizer> auth;
  std::unique_ptr<Scheduler> scheduler;
  // Destroyed (its tasks joined) before the scheduler: tasks hold MemoryReservations of it.
  std::unique_ptr<OffloadPool> offload;
  std::unique_ptr<ReshardService> service;
  std::unique_ptr<grpc::Server> grpc_server;
  absl::Mutex shutdown_mu;
  bool shut_down ABSL_GUARDED_BY(shutdown_mu) = false;
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  Shutdown();
  Wait();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  if (options.state_dir.empty()) return absl::InvalidArgumentError("--state-dir is required");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  ASSIGN_OR_RETURN(PathPolicy paths, PathPolicy::Create(options.allowed_roots));
  impl->paths = std::make_unique<PathPolicy>(std::move(paths));
  if (!options.auth_tokens.empty()) {
    ASSIGN_OR_RETURN(impl->auth, Authorizer::Create(options.auth_tokens, impl->paths.get()));
  }
  ASSIGN_OR_RETURN(impl->store, JobStore::Open(options.state_dir));

  std::string metrics_address;
  if (!options.metrics_listen.empty()) {
    try {
      impl->exposer = std::make_unique<prometheus::Exposer>(options.metrics_listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen for metrics on ", options.metrics_listen, ": ", e.what()));
    }
    impl->exposer->RegisterCollectable(impl->metrics.registry());
    impl->exposer->RegisterCollectable(impl->process_metrics);
    impl->exposer->RegisterCollectable(impl->s3_metrics);
    const std::string host = options.metrics_listen.substr(0, options.metrics_listen.rfind(':'));
    metrics_address = absl::StrCat(host, ":", impl->exposer->GetListeningPorts().at(0));
  }

  // Paths were checked at submit; check the input tree again when the job starts, since it
  // may have changed while the job was queued (or across a restart).
  JobRunner engine = options.runner ? options.runner : RunJobWithEngine;
  // A token's job runs under the token's roots as they are now (a token removed from the
  // file meanwhile fails its jobs).
  const PathPolicy* daemon_policy = impl->paths.get();
  const Authorizer* auth = impl->auth.get();
  JobRunner runner = [engine, daemon_policy, auth](
                         const v1::Job& job,
                         JobContext& context) -> absl::StatusOr<ConversionResult> {
    std::shared_ptr<const PathPolicy> policy(std::shared_ptr<void>(), daemon_policy);
    if (auth != nullptr && !job.owner().empty()) {
      absl::StatusOr<Caller> owner = auth->Find(job.owner());
      if (!owner.ok()) {
        return absl::PermissionDeniedError(
            absl::StrCat("the token \"", job.owner(), "\" that submitted the job is no longer in ",
                         auth->file()));
      }
      policy = owner->paths;
    }
    // Everything the job opens from here on stays beneath the allowed roots.
    ScopedPathConfinement confined(policy->confinement());
    absl::StatusOr<std::string> input = policy->CheckInputTree(job.spec().input());
    if (!input.ok()) return input.status();
    if (!job.spec().tokenizer().empty()) {
      RETURN_IF_ERROR(policy->CheckInputTree(job.spec().tokenizer()).status(), "spec.tokenizer");
    }
    return engine(job, context);
  };
  MemoryEstimator estimator = options.estimator ? options.estimator : EstimateJobMemory;
  impl->scheduler = std::make_unique<Scheduler>(options.scheduler, impl->store.get(),
                                                &impl->metrics, runner, estimator);
  RETURN_IF_ERROR(impl->scheduler->Start());
  impl->offload = std::make_unique<OffloadPool>(options.offload);
  impl->service = std::make_unique<ReshardService>(impl->scheduler.get(), impl->paths.get(),
                                                   impl->offload.get(), impl->auth.get());

  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (options.tls.enabled()) {
    ASSIGN_OR_RETURN(impl->tls, ServerTls::Create(options.tls, options.state_dir + "/tls"));
    credentials = impl->tls->credentials();
    Metrics* metrics = &impl->metrics;
    impl->handshake_log = std::make_unique<TlsHandshakeLog>(
        kHandshakeLogInterval, [metrics] { metrics->TlsHandshakeFailed(); });
  }
  WarnIfExposed(options);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, credentials, &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxRequestBytes));
  // gRPC sets SO_REUSEPORT by default: a second daemon on the same port would start and
  // silently share clients with the first. Refuse a busy port instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(impl->service.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(impl->grpc_metrics.NewInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  impl->grpc_server = builder.BuildAndStart();
  if (impl->grpc_server == nullptr || port == 0) {
    impl->scheduler->Shutdown(absl::ZeroDuration());
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  impl->grpc_server->GetHealthCheckService()->SetServingStatus(true);
  impl->process_metrics->ResetBaseline();

  std::unique_ptr<Server> server(new Server(std::move(impl)));
  const std::string host = options.listen.substr(0, options.listen.rfind(':'));
  server->address_ = absl::StrCat(host, ":", port);
  server->metrics_address_ = metrics_address;
  server->scheduler_ = server->impl_->scheduler.get();
  return server;
}

absl::Status Server::Reload() {
  absl::Status status;
  if (impl_->tls != nullptr) status.Update(impl_->tls->Reload());
  if (impl_->auth != nullptr) status.Update(impl_->auth->Reload());
  return status;
}

void Server::Shutdown() {
  {
    absl::MutexLock lock(&impl_->shutdown_mu);
    if (impl_->shut_down) return;
    impl_->shut_down = true;
  }
  impl_->grpc_server->GetHealthCheckService()->SetServingStatus(false);
  impl_->scheduler->StopAccepting();
  impl_->scheduler->Shutdown(impl_->options.shutdown_grace);
  // Streams end once the scheduler stops; unary calls get a short deadline to finish.
  impl_->grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  // reshardd exits without destructors: the failures since the last line are logged now.
  if (impl_->handshake_log != nullptr) impl_->handshake_log->Flush();
}

void Server::Wait() { impl_->grpc_server->Wait(); }

OffloadPool& Server::offload_pool() { return *impl_->offload; }

}  // namespace reshard
