// The reshard.v1 JobSpec <-> ConversionSpec half of the spec codec (lib/engine/spec_codec.h):
// every row of SpecFields() with a JobSpec field is copied by that field's name, so reshardctl,
// the daemon and any client that fills a JobSpec (clients/python) reach the engine the same
// way. Kept out of lib/ so that the engine links no protobuf or gRPC.

#ifndef RESHARD_PROTO_RESHARD_V1_JOB_SPEC_CODEC_H_
#define RESHARD_PROTO_RESHARD_V1_JOB_SPEC_CODEC_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/engine/conversion.h"
#include "proto/reshard/v1/reshard.pb.h"

namespace reshard {

// JobSpec fields that are the daemon's, not the conversion's: admission and queueing.
inline constexpr absl::string_view kJobOnlyFields[] = {"memory_budget", "priority"};

// The ConversionSpec of `proto`: zero and empty fields are ConversionSpec's defaults. Paths
// and rules are as sent (the daemon checks them against its roots, it reads no rule files).
// InvalidArgument naming the field ("spec.kind", "spec.dtype", "spec.io") for a value no
// ConversionSpec holds; ranges are ValidateSpec's (spec_codec.h).
absl::StatusOr<ConversionSpec> ConversionSpecFromProto(const v1::JobSpec& proto);

// The JobSpec of a normalised `spec` (NormalizeSpec: rules inline, paths absolute). The job's
// own fields (kJobOnlyFields) are the caller's to set.
v1::JobSpec JobSpecFromConversionSpec(const ConversionSpec& spec);

}  // namespace reshard

#endif  // RESHARD_PROTO_RESHARD_V1_JOB_SPEC_CODEC_H_
