#include "server/grpc_metrics.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"

namespace reshard {
namespace {

using grpc::experimental::InterceptionHookPoints;

constexpr int kCodes = 17;  // OK .. UNAUTHENTICATED

// Latencies of unary calls are milliseconds; WatchJob streams last as long as their job.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600};
}

// Times one call, from its creation to the status it sends.
class MetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(GrpcServerMetrics* metrics, const char* method)
      : metrics_(metrics),
        method_(method == nullptr ? "" : method),
        start_(std::chrono::steady_clock::now()) {
    metrics_->Started(method_);
  }
  // A call that ended without sending a status (the client went away first) still counts.
  ~MetricsInterceptor() override {
    if (!handled_) metrics_->Handled(method_, grpc::StatusCode::CANCELLED, Seconds());
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (!handled_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      handled_ = true;
      metrics_->Handled(method_, methods->GetSendStatus().error_code(), Seconds());
    }
    methods->Proceed();
  }

 private:
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  GrpcServerMetrics* const metrics_;
  const std::string method_;
  const std::chrono::steady_clock::time_point start_;
  bool handled_ = false;
};

class MetricsInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactory(GrpcServerMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MetricsInterceptor(metrics_, info->method());
  }

 private:
  GrpcServerMetrics* const metrics_;
};

const char* TypeName(bool client_streaming, bool server_streaming) {
  if (client_streaming && server_streaming) return "bidi_stream";
  if (client_streaming) return "client_stream";
  if (server_streaming) return "server_stream";
  return "unary";
}

}  // namespace

const char* GrpcServerMetrics::CodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[kCodes] = {
      "OK",       "Canceled",       "Unknown",          "InvalidArgument",   "DeadlineExceeded",
      "NotFound", "AlreadyExists",  "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
      "Aborted",  "OutOfRange",     "Unimplemented",    "Internal",          "Unavailable",
      "DataLoss", "Unauthenticated"};
  const int index = static_cast<int>(code);
  return index >= 0 && index < kCodes ? kNames[index] : "Unknown";
}

GrpcServerMetrics::GrpcServerMetrics(prometheus::Registry& registry,
                                     const std::vector<std::string>& services)
    : started_(prometheus::BuildCounter()
                   .Name("grpc_server_started_total")
                   .Help("Total number of RPCs started on the server.")
                   .Register(registry)),
      handled_(prometheus::BuildCounter()
                   .Name("grpc_server_handled_total")
                   .Help("Total number of RPCs completed on the server, regardless of success "
                         "or failure.")
                   .Register(registry)),
      seconds_(prometheus::BuildHistogram()
                   .Name("grpc_server_handling_seconds")
                   .Help("Histogram of response latency (seconds) of gRPC that had been "
                         "application-level handled by the server.")
                   .Register(registry)) {
  for (const std::string& name : services) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    if (service == nullptr) continue;
    for (int i = 0; i < service->method_count(); ++i) {
      const google::protobuf::MethodDescriptor* method = service->method(i);
      AddMethod(name, method->name(),
                TypeName(method->client_streaming(), method->server_streaming()));
    }
  }
  // gRPC's own services, which are not in the generated pool.
  AddMethod("grpc.health.v1.Health", "Check", "unary");
  AddMethod("grpc.health.v1.Health", "Watch", "server_stream");
  AddMethod("grpc.reflection.v1alpha.ServerReflection", "ServerReflectionInfo", "bidi_stream");
  const std::map<std::string, std::string> labels = {
      {"grpc_service", "unknown"}, {"grpc_method", "unknown"}, {"grpc_type", "unknown"}};
  unknown_.started = &started_.Add(labels);
  unknown_.seconds = &seconds_.Add(labels, LatencyBuckets());
  for (int code = 0; code < kCodes; ++code) {
    auto with_code = labels;
    with_code["grpc_code"] = CodeName(static_cast<grpc::StatusCode>(code));
    unknown_.handled.push_back(&handled_.Add(with_code));
  }
}

void GrpcServerMetrics::AddMethod(const std::string& service, const std::string& method,
                                  const std::string& type) {
  const std::map<std::string, std::string> labels = {
      {"grpc_service", service}, {"grpc_method", method}, {"grpc_type", type}};
  MethodSeries series;
  series.started = &started_.Add(labels);
  series.seconds = &seconds_.Add(labels, LatencyBuckets());
  for (int code = 0; code < kCodes; ++code) {
    auto with_code = labels;
    with_code["grpc_code"] = CodeName(static_cast<grpc::StatusCode>(code));
    series.handled.push_back(&handled_.Add(with_code));
  }
  methods_[absl::StrCat("/", service, "/", method)] = std::move(series);
}

const GrpcServerMetrics::MethodSeries& GrpcServerMetrics::Find(
    const std::string& full_method) const {
  auto it = methods_.find(full_method);
  return it == methods_.end() ? unknown_ : it->second;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
GrpcServerMetrics::NewInterceptorFactory() {
  return std::make_unique<MetricsInterceptorFactory>(this);
}

void GrpcServerMetrics::Started(const std::string& full_method) {
  Find(full_method).started->Increment();
}

void GrpcServerMetrics::Handled(const std::string& full_method, grpc::StatusCode code,
                                double seconds) {
  const MethodSeries& series = Find(full_method);
  const int index = static_cast<int>(code);
  series.handled[index >= 0 && index < kCodes ? index : 2]->Increment();  // 2: Unknown
  series.seconds->Observe(seconds);
}

}  // namespace reshard
