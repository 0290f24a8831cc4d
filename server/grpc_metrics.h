// gRPC server metrics with go-grpc-prometheus's names and labels, so its dashboards and alert
// rules work on reshardd unchanged:
//
//   grpc_server_started_total{grpc_service,grpc_method,grpc_type}
//   grpc_server_handled_total{grpc_service,grpc_method,grpc_type,grpc_code}
//   grpc_server_handling_seconds{grpc_service,grpc_method,grpc_type}   (histogram)
//
// grpc_code is the Go spelling of the status code ("OK", "InvalidArgument", ...), grpc_type
// one of unary, client_stream, server_stream, bidi_stream. Calls are counted by a server
// interceptor (grpc::experimental::ServerInterceptorFactoryInterface), so every service on
// the server is covered, health and reflection included. Series of the known services'
// methods are created up front for every code; a method outside them is counted as
// grpc_service="unknown", grpc_method="unknown", so a client cannot create series at will.

#ifndef RESHARD_SERVER_GRPC_METRICS_H_
#define RESHARD_SERVER_GRPC_METRICS_H_

#include <grpcpp/support/server_interceptor.h>
#include <grpcpp/support/status.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace reshard {

class GrpcServerMetrics {
 public:
  // Registers the families in `registry` and pre-initialises the methods of `services` (full
  // protobuf names found in the generated descriptor pool, e.g. "reshard.v1.Reshard") and of
  // grpc.health.v1.Health and the reflection service.
  GrpcServerMetrics(prometheus::Registry& registry, const std::vector<std::string>& services);

  // For ServerBuilder::experimental().SetInterceptorCreators. `this` must outlive the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewInterceptorFactory();

  // `full_method` as gRPC gives it: "/package.Service/Method".
  void Started(const std::string& full_method);
  void Handled(const std::string& full_method, grpc::StatusCode code, double seconds);

  // "OK", "Canceled", "InvalidArgument", ... as in Go's codes.Code.String().
  static const char* CodeName(grpc::StatusCode code);

 private:
  struct MethodSeries {
    prometheus::Counter* started = nullptr;
    std::vector<prometheus::Counter*> handled;  // by status code 0..16
    prometheus::Histogram* seconds = nullptr;
  };
  void AddMethod(const std::string& service, const std::string& method, const std::string& type);
  const MethodSeries& Find(const std::string& full_method) const;

  prometheus::Family<prometheus::Counter>& started_;
  prometheus::Family<prometheus::Counter>& handled_;
  prometheus::Family<prometheus::Histogram>& seconds_;
  // Built in the constructor, read-only afterwards (so lookups need no lock).
  std::map<std::string, MethodSeries> methods_;
  MethodSeries unknown_;
};

}  // namespace reshard

#endif  // RESHARD_SERVER_GRPC_METRICS_H_
