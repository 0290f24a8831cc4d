// Conversions whose output is an S3 key prefix (`s3://bucket/prefix`) instead of a folder.
//
// S3 has no rename, so the output cannot be staged and published in one step as a folder is
// (lib/io/staging_dir.h). Instead the objects are written in an order that makes the manifest
// the commit mark, as it is locally:
//
//   1. The prefix (`prefix/`, whole segments) is listed before anything is read. A prefix with
//      objects is refused (FailedPrecondition) unless `overwrite` is set, or unless it holds
//      the leftovers of an unfinished run: the in-progress marker and no manifest.
//   2. The conversion is planned (nothing written yet; a bad input changes nothing).
//   3. The old manifest is deleted first, so that from here on nothing under the prefix is
//      taken for a finished output; then the in-progress marker `reshard-in-progress.json` is
//      written, then every other old object is deleted (the old output is gone before the new
//      one is written: no mix of old and new files, no doubled storage) except the data
//      objects reused below and their records, and unfinished multipart uploads under the
//      prefix (a killed run's) are aborted.
//   4. Every data file is streamed as a multipart upload (S3ObjectWriter) through the
//      executor's digest and size check; an object exists only once complete. Right after
//      its upload completes, its record is PUT: `prefix/.reshard-progress/<file>.json`.
//   5. The companion files (index), then the manifest `reshard-manifest.json` are written with
//      PUT. The manifest lists every file with its size and XXH3-64, as locally.
//   6. The records and the marker are removed (best effort: beside a manifest they mean
//      nothing), so a finished prefix holds the output, the index and the manifest only.
//
// A run killed anywhere before 5 leaves no manifest and no index; before 3 it changes nothing.
// Rerunning the same command takes the unfinished prefix over (its marker says it is
// reshard's), aborts stale uploads, and reuses the data objects the killed run finished.
// A run killed between deleting the old manifest and writing the marker leaves old objects
// without either, which only `overwrite` replaces.
//
// Reuse of finished objects. S3 has no append, so a run cannot extend one journal object as a
// local run extends its journal file; rewriting one shared object (the marker) per finished
// file would serialize the workers on a read-modify-write and cost O(files^2) bytes. Each
// finished object therefore gets its own small record, PUT once after its upload completed
// and before the executor counts the file done: {plan_id, name, bytes, xxh3_64, etag}. The
// XXH3-64 is the one the executor computed while streaming the file (the manifest's), the
// ETag the one CompleteMultipartUpload returned. `plan_id` is the XXH3-64 of what decides the
// bytes (the request as ConversionRequestJson gives it, without overwrite/update_latest;
// reshard's version; the planned data files with their sizes; the sources with their sizes),
// as a partitioned conversion's split id is of split.json. A rerun (after the plan, before
// step 3) reads every record under the prefix and keeps a data object only when the record
// is of this plan, names a planned file of the recorded size, and a HEAD of the object shows
// the recorded size and ETag (it was not replaced since). Anything else is uploaded again,
// never an error: records of another plan or damaged ones are deleted with the other old
// objects, a mismatching object counts in verification_failures, and a complete object
// whose record was never written (killed between the two PUTs) is written again. A kept
// object goes into the manifest with its recorded size and XXH3-64, so the finished output
// and its manifest are those of an uninterrupted run. Not detected: an input rewritten in
// place with the same file sizes between the runs (the plan id cannot see its bytes).
//
// Not detected: two runs writing the same prefix at once (S3 has no lock; the second aborts the
// first's uploads and deletes its objects, and the first then fails).

#ifndef RESHARD_LIB_ENGINE_OBJECT_STORE_OUTPUT_H_
#define RESHARD_LIB_ENGINE_OBJECT_STORE_OUTPUT_H_

#include "absl/status/statusor.h"
#include "lib/engine/conversion.h"

namespace reshard {

class S3Client;  // lib/io/s3/s3_client.h

// The object that marks an s3:// output prefix as being written by a run of reshard.
inline constexpr char kInProgressMarkerName[] = "reshard-in-progress.json";
// The sub-prefix of the records of finished data objects while a run writes the prefix.
inline constexpr char kObjectRecordsFolder[] = ".reshard-progress";

// Runs the conversion `spec` into the s3:// prefix spec.output (see above) with the process's
// S3 client (DefaultS3Client: credentials and endpoint from the AWS environment). The result
// lists the data files and the index as RunConversion's does; its `output` is the URL.
// Partitioned conversions are not supported (Unimplemented). A rerun into an unfinished prefix
// keeps the data objects an earlier run of the same plan finished (see above; the result's
// reused_files and reused_bytes); control.completed_files is not needed for that and ignored.
// Errors name the bucket, the key and the S3 error code.
absl::StatusOr<ConversionResult> RunConversionToObjectStore(const ConversionSpec& spec,
                                                            const RunControl& control = {});

// The checks RunConversionToObjectStore makes before reading anything (the input is not inside
// the output prefix; the prefix is empty, or overwriting is asked for, or it is an unfinished
// run's), with the process's client: for reshardd to refuse at submit what the job would.
absl::Status CheckObjectStoreOutputUsable(const ConversionSpec& spec);

// The same with the given client.
absl::StatusOr<ConversionResult> RunConversionToObjectStore(const ConversionSpec& spec,
                                                            const RunControl& control,
                                                            S3Client& client);

}  // namespace reshard

#endif  // RESHARD_LIB_ENGINE_OBJECT_STORE_OUTPUT_H_
