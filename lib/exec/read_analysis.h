// How a CopyPlan reads its sources, worked out before any byte is read: which sources are read
// once (their pages dropped behind the reads) and which ranges several times (kept in the page
// cache), which sources are read in whole boxes (direct I/O under IoMode::kAuto), and which
// output files one worker writes in turns so that the rows their strips come from are read once.

#ifndef RESHARD_LIB_EXEC_READ_ANALYSIS_H_
#define RESHARD_LIB_EXEC_READ_ANALYSIS_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "lib/plan/layout.h"

namespace reshard {

// How the boxes of a plan read one source.
struct SourceReads {
  // No byte is read twice once the boxes read the same way several times count once (the
  // bytes the distinct boxes read add up to no more than the union of their ranges): its
  // pages can be dropped from the page cache as they are read, outside `repeated`.
  bool read_once = true;
  // The byte ranges of the boxes read the same way several times (a tensor replicated into
  // every output part, read once per part), sorted and merged: they are read through the page
  // cache and kept there (MappedFile::set_repeated_ranges), the rest of the file is read
  // directly where the mode allows.
  std::vector<std::pair<uint64_t, uint64_t>> repeated;
};
std::vector<SourceReads> AnalyzeSourceReads(const CopyPlan& plan);

// For each source of `plan`, whether every box read from it is dense (reads all the bytes from
// its first to its last, as a whole tensor does; the strips of a split do not). IoMode::kAuto
// reads dense sources read once with direct I/O.
std::vector<bool> SourcesReadDense(const CopyPlan& plan);

// How the workers take the files of `plan`: units of one file, or of files written in turns
// by one worker (up to 8). Files with the same tensors in the same order, one of which reads
// strips of rows (the parts of a split along a later dimension), that read strips of the same
// source files (directly or through one another), are written in turns, so that the rows their
// strips come from are read once for all of them, as whole rows, directly (written one after
// another, 4 parts would each read every such row through the page cache). Parts reading different
// sources (2 model-parallel files split into 4) make separate units, whatever replicated
// tensors they all read from one source (norms).
// More than 8 such files go in units as even as can be, each reading the rows through the page
// cache.
struct WorkUnit {
  std::vector<size_t> files;  // indexes into plan.files
  // Written in turns, and these are all the files that read strips of the same rows: the
  // strips are read as whole rows (TensorFiller::set_strips_whole).
  bool whole_rows = false;
};
std::vector<WorkUnit> WorkUnits(const CopyPlan& plan);

// Whether `copy` reads strips of rows: rows of its source that it reads only part of, whose
// other bytes other boxes (the other parts of a split along a later dimension) read.
bool ReadsStrips(const TensorCopy& copy);

// The indices of `file`'s tensor segments, in order.
std::vector<size_t> TensorSegments(const FilePlan& file);

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_READ_ANALYSIS_H_
