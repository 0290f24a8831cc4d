// Conversions whose output is on a store without rename or folders of its own (S3 `s3://`,
// the in-process `mem://`; kvstore::Driver::has_folders false): the data files are written in
// place, under the in-progress marker, and the manifest written last marks the output
// finished. The commit protocol (refusing a non-empty output, taking an unfinished one over,
// records of finished files and their reuse on a rerun) is the one of every output:
// lib/engine/output_commit.h.

#ifndef RESHARD_LIB_ENGINE_OBJECT_STORE_OUTPUT_H_
#define RESHARD_LIB_ENGINE_OBJECT_STORE_OUTPUT_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/engine/conversion.h"
#include "lib/io/kvstore/driver.h"

namespace reshard {

// Runs the conversion `spec` into spec.output with the driver that serves it
// (kvstore::ParseLocation). The result lists the data files and the index as RunConversion's
// does; its `output` is spec.output without a trailing '/'. A partitioned spec is refused
// (Unimplemented): RunAnyConversion runs those (partitioned_conversion.h). A rerun into an unfinished output keeps the data files an earlier
// run of the same plan finished (the result's reused_files and reused_bytes). Errors name the
// file and the storage's error.
absl::StatusOr<ConversionResult> RunConversionToObjectStore(const ConversionSpec& spec,
                                                            const RunControl& control = {});

// The same with the given driver (tests: an S3Store over an in-memory S3 client).
absl::StatusOr<ConversionResult> RunConversionToObjectStore(const ConversionSpec& spec,
                                                            const RunControl& control,
                                                            const kvstore::Driver& driver);

// The checks RunConversionToObjectStore makes before reading anything (the input is not inside
// the output; the output is empty, or overwriting is asked for, or it is an unfinished run's):
// for reshardd to refuse at submit what the job would.
absl::Status CheckObjectStoreOutputUsable(const ConversionSpec& spec);

}  // namespace reshard

#endif  // RESHARD_LIB_ENGINE_OBJECT_STORE_OUTPUT_H_
