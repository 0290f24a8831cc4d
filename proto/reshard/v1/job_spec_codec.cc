#include "proto/reshard/v1/job_spec_codec.h"

#include <string>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "lib/core/status.h"
#include "lib/engine/spec_codec.h"

namespace reshard {
namespace {

using google::protobuf::FieldDescriptor;

absl::StatusOr<ConversionSpec::Kind> KindFromProto(int value) {
  switch (value) {
    case v1::JOB_KIND_CONSOLIDATE:
      return ConversionSpec::Kind::kConsolidate;
    case v1::JOB_KIND_RESHARD:
      return ConversionSpec::Kind::kReshard;
    default:
      return absl::InvalidArgumentError(
          "spec.kind must be JOB_KIND_CONSOLIDATE or JOB_KIND_RESHARD");
  }
}

int KindToProto(ConversionSpec::Kind kind) {
  return kind == ConversionSpec::Kind::kReshard ? v1::JOB_KIND_RESHARD : v1::JOB_KIND_CONSOLIDATE;
}

absl::StatusOr<DTypePolicy> DTypeFromProto(int value) {
  switch (value) {
    case v1::DTYPE_KEEP:
      return DTypePolicy::kKeep;
    case v1::DTYPE_FP32:
      return DTypePolicy::kF32;
    case v1::DTYPE_BF16:
      return DTypePolicy::kBF16;
    case v1::DTYPE_FP16:
      return DTypePolicy::kF16;
    default:
      return absl::InvalidArgumentError("spec.dtype is unknown");
  }
}

int DTypeToProto(DTypePolicy dtype) {
  switch (dtype) {
    case DTypePolicy::kF32:
      return v1::DTYPE_FP32;
    case DTypePolicy::kBF16:
      return v1::DTYPE_BF16;
    case DTypePolicy::kF16:
      return v1::DTYPE_FP16;
    case DTypePolicy::kKeep:
      break;
  }
  return v1::DTYPE_KEEP;
}

// The JobSpec field of `field`, of the C++ type its member needs. Internal when the proto and
// the table disagree (a programming error that job_spec_codec_test catches).
absl::StatusOr<const FieldDescriptor*> ProtoField(const SpecField& field) {
  const FieldDescriptor* proto =
      v1::JobSpec::descriptor()->FindFieldByName(std::string(field.proto));
  if (proto == nullptr) {
    return absl::InternalError(absl::StrCat("reshard.v1.JobSpec has no field ", field.proto));
  }
  const FieldDescriptor::CppType want = std::visit(
      Overloaded{[](SpecMember<ConversionSpec::Kind>) { return FieldDescriptor::CPPTYPE_ENUM; },
                 [](SpecMember<DTypePolicy>) { return FieldDescriptor::CPPTYPE_ENUM; },
                 [](SpecMember<std::string>) { return FieldDescriptor::CPPTYPE_STRING; },
                 [](SpecMember<IoMode>) { return FieldDescriptor::CPPTYPE_STRING; },
                 [](SpecMember<uint64_t>) { return FieldDescriptor::CPPTYPE_UINT64; },
                 [](SpecMember<int>) { return FieldDescriptor::CPPTYPE_INT32; },
                 [](SpecMember<bool>) { return FieldDescriptor::CPPTYPE_BOOL; }},
      field.access);
  if (proto->cpp_type() != want || proto->is_repeated()) {
    return absl::InternalError(absl::StrCat("reshard.v1.JobSpec.", field.proto,
                                            " does not have the type of ConversionSpec's ",
                                            field.name));
  }
  return proto;
}

}  // namespace

absl::StatusOr<ConversionSpec> ConversionSpecFromProto(const v1::JobSpec& proto) {
  const google::protobuf::Reflection& reflection = *proto.GetReflection();
  ConversionSpec spec;
  for (const SpecField& field : SpecFields()) {
    if (field.proto.empty()) continue;
    ASSIGN_OR_RETURN(const FieldDescriptor* f, ProtoField(field));
    // proto3 scalars have no presence: zero is "not set", ConversionSpec's default then (every
    // default that is not zero belongs to a zero_is_default row).
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_ENUM && !reflection.HasField(proto, f)) continue;
    RETURN_IF_ERROR(std::visit(
        Overloaded{[&](SpecMember<ConversionSpec::Kind> m) -> absl::Status {
                     ASSIGN_OR_RETURN(m(spec), KindFromProto(reflection.GetEnumValue(proto, f)));
                     return absl::OkStatus();
                   },
                   [&](SpecMember<DTypePolicy> m) -> absl::Status {
                     ASSIGN_OR_RETURN(m(spec), DTypeFromProto(reflection.GetEnumValue(proto, f)));
                     return absl::OkStatus();
                   },
                   [&](SpecMember<IoMode> m) -> absl::Status {
                     ASSIGN_OR_RETURN(m(spec), ParseIoMode(reflection.GetString(proto, f)),
                                      absl::StrCat("spec.", field.proto));
                     return absl::OkStatus();
                   },
                   [&](SpecMember<std::string> m) -> absl::Status {
                     m(spec) = reflection.GetString(proto, f);
                     return absl::OkStatus();
                   },
                   [&](SpecMember<uint64_t> m) -> absl::Status {
                     m(spec) = reflection.GetUInt64(proto, f);
                     return absl::OkStatus();
                   },
                   [&](SpecMember<int> m) -> absl::Status {
                     m(spec) = reflection.GetInt32(proto, f);
                     return absl::OkStatus();
                   },
                   [&](SpecMember<bool> m) -> absl::Status {
                     m(spec) = reflection.GetBool(proto, f);
                     return absl::OkStatus();
                   }},
        field.access));
  }
  return spec;
}

v1::JobSpec JobSpecFromConversionSpec(const ConversionSpec& spec) {
  v1::JobSpec proto;
  const google::protobuf::Reflection& reflection = *proto.GetReflection();
  for (const SpecField& field : SpecFields()) {
    if (field.proto.empty()) continue;
    absl::StatusOr<const FieldDescriptor*> f = ProtoField(field);
    if (!f.ok()) continue;  // ConversionSpecFromProto reports it; the test checks both
    std::visit(Overloaded{[&](SpecMember<ConversionSpec::Kind> m) {
                            reflection.SetEnumValue(&proto, *f, KindToProto(ReadSpecMember(spec, m)));
                          },
                          [&](SpecMember<DTypePolicy> m) {
                            reflection.SetEnumValue(&proto, *f, DTypeToProto(ReadSpecMember(spec, m)));
                          },
                          [&](SpecMember<IoMode> m) {
                            reflection.SetString(&proto, *f, std::string(IoModeName(ReadSpecMember(spec, m))));
                          },
                          [&](SpecMember<std::string> m) {
                            reflection.SetString(&proto, *f, ReadSpecMember(spec, m));
                          },
                          [&](SpecMember<uint64_t> m) {
                            reflection.SetUInt64(&proto, *f, ReadSpecMember(spec, m));
                          },
                          [&](SpecMember<int> m) { reflection.SetInt32(&proto, *f, ReadSpecMember(spec, m)); },
                          [&](SpecMember<bool> m) { reflection.SetBool(&proto, *f, ReadSpecMember(spec, m)); }},
               field.access);
  }
  return proto;
}

}  // namespace reshard
