// grpc_probe: a raw gRPC caller for the reshardd end-to-end tests (tests/daemon/daemon_test.py).
//
//   grpc_probe ADDR health
//   grpc_probe ADDR SubmitJob|Plan|Inspect|GetJob|CancelJob 'REQUEST AS JSON' (or - for stdin)
//
// Sends the request exactly as given (no path normalization, unlike reshardctl), with a 10 s
// deadline, and prints one JSON line on stdout:
//   {"code": N, "code_name": "...", "message": "...", "response": {...} | null, "seconds": S,
//    "trailing_metadata": {"key": "value", ...}}
// ("seconds": how long the call took, once connected; "trailing_metadata": the server's text
// trailing metadata, "-bin" keys left out).
// For `health`, "response" is {"status": "SERVING"} (grpc.health.v1, service ""). Exit code 0
// whenever a call was made (whatever its status); 2 on a usage or JSON error.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "google/protobuf/util/json_util.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/reshard/v1/reshard.grpc.pb.h"

namespace {

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

// A JSON string literal (the message may hold quotes, backslashes, control characters).
std::string Quote(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// `seconds`: the call's duration, printed when known (>= 0); `context`: the finished call's, whose
// trailing metadata is printed when given.
int Print(const grpc::Status& status, const google::protobuf::Message* response,
          double seconds = -1, const grpc::ClientContext* context = nullptr) {
  std::string body = "null";
  if (status.ok() && response != nullptr) {
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    body.clear();
    if (!google::protobuf::util::MessageToJsonString(*response, &body, options).ok()) body = "null";
  }
  std::cout << "{\"code\": " << static_cast<int>(status.error_code())
            << ", \"code_name\": " << Quote(CodeName(status.error_code()))
            << ", \"message\": " << Quote(status.error_message()) << ", \"response\": " << body;
  if (seconds >= 0) std::cout << ", \"seconds\": " << seconds;
  if (context != nullptr) {
    std::cout << ", \"trailing_metadata\": {";
    const char* separator = "";
    for (const auto& [key, value] : context->GetServerTrailingMetadata()) {
      const std::string name(key.data(), key.size());
      if (name.size() >= 4 && name.compare(name.size() - 4, 4, "-bin") == 0) continue;
      std::cout << separator << Quote(name) << ": "
                << Quote(std::string(value.data(), value.size()));
      separator = ", ";
    }
    std::cout << "}";
  }
  std::cout << "}" << std::endl;
  return 0;
}

bool Parse(const std::string& json, google::protobuf::Message* message) {
  auto status = google::protobuf::util::JsonStringToMessage(json, message);
  if (!status.ok()) {
    std::cerr << "grpc_probe: bad request JSON: " << status.ToString() << "\n";
    return false;
  }
  return true;
}

template <typename Request, typename Response, typename Method>
int Unary(reshard::v1::Reshard::Stub& stub, Method method, const std::string& json) {
  Request request;
  if (!Parse(json, &request)) return 2;
  Response response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const auto start = std::chrono::steady_clock::now();
  grpc::Status status = (stub.*method)(&context, request, &response);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  return Print(status, &response, took.count(), &context);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: grpc_probe ADDR health | grpc_probe ADDR METHOD REQUEST_JSON\n";
    return 2;
  }
  const std::string address = argv[1];
  const std::string method = argv[2];
  std::string json = argc > 3 ? argv[3] : "{}";
  if (json == "-") {  // the request on stdin (argv strings are capped at 128 KiB)
    std::ostringstream text;
    text << std::cin.rdbuf();
    json = text.str();
  }
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  if (method == "health") {
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    grpc::Status status = stub->Check(&context, request, &response);
    if (!status.ok()) return Print(status, nullptr);
    std::cout
        << "{\"code\": 0, \"code_name\": \"OK\", \"message\": \"\", \"response\": {\"status\": "
        << Quote(grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()))
        << "}}" << std::endl;
    return 0;
  }
  // Connected first, so that "seconds" is the call alone.
  channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stub = reshard::v1::Reshard::NewStub(channel);
  using namespace reshard::v1;
  if (method == "SubmitJob")
    return Unary<SubmitJobRequest, Job>(*stub, &Reshard::Stub::SubmitJob, json);
  if (method == "Plan") return Unary<PlanRequest, PlanResponse>(*stub, &Reshard::Stub::Plan, json);
  if (method == "Inspect") {
    return Unary<InspectRequest, InspectResponse>(*stub, &Reshard::Stub::Inspect, json);
  }
  if (method == "GetJob") return Unary<GetJobRequest, Job>(*stub, &Reshard::Stub::GetJob, json);
  if (method == "CancelJob")
    return Unary<CancelJobRequest, Job>(*stub, &Reshard::Stub::CancelJob, json);
  std::cerr << "grpc_probe: unknown method " << method << "\n";
  return 2;
}
