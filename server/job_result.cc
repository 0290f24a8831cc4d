#include "server/job_result.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace reshard {

void SetJobProgress(const Progress& p, v1::Job& job) {
  v1::Progress* progress = job.mutable_progress();
  progress->set_bytes_done(p.bytes_done);
  progress->set_bytes_total(p.bytes_total);
  progress->set_tensors_done(p.tensors_done);
  progress->set_tensors_total(p.tensors_total);
  progress->set_files_done(p.files_done);
  progress->set_files_total(p.files_total);
}

void SetOutputFile(const WrittenFile& file, v1::OutputFile& out) {
  out.set_name(file.name);
  out.set_bytes(file.bytes);
  out.set_xxh3_64(absl::StrFormat("%016x", file.xxh3_64));
}

void SetJobResult(const ConversionResult& result, v1::Job& job) {
  job.set_bytes_read(result.bytes_read);
  job.set_bytes_written(result.bytes_written);
  job.set_reused_files(result.reused_files);
  job.set_reused_bytes(result.reused_bytes);
  v1::PhaseTimings* timings = job.mutable_timings();
  timings->set_plan_seconds(result.plan_seconds);
  timings->set_write_seconds(result.data_files_seconds);  // the API keeps its name
  timings->set_publish_seconds(result.publish_seconds);
  timings->set_read_seconds(result.data_phases.read);
  timings->set_convert_seconds(result.data_phases.convert);
  timings->set_write_io_seconds(result.data_phases.write);
  timings->set_fsync_seconds(result.data_phases.fsync);
  timings->set_verify_seconds(result.data_phases.verify);
  job.clear_output_files();
  for (const WrittenFile& file : result.files) SetOutputFile(file, *job.add_output_files());
  job.clear_committed_files();
  if (result.found_published) {
    job.set_note(absl::StrCat(
        "the output was published by attempt ", job.attempts() - 1,
        ", which was interrupted before recording success; every file was checked against "
        "its manifest"));
  }
}

}  // namespace reshard
