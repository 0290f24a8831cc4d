// Small checkpoints of every input format, for the format conformance suite
// (//lib/formats:conformance_test), in the manner of tensorstore's driver test suites
// (driver_testutil.h): each input format supplies a fixture builder, registered under its
// format id from its own testonly library (`lib/formats/<format>/<format>_fixture.cc`, which
// sets alwayslink), and the suite runs the same checks over every registered format. A new
// input format joins by registering its fixture; the suite fails for a registered input format
// without one.
//
// A fixture also says where its bytes are (metadata, a length or offset field, tensor data), so
// that the suite can truncate it and flip bytes in it at places that mean something.
//
// testonly: builders write whatever they are asked to and report failures through GoogleTest.

#ifndef RESHARD_LIB_FORMATS_FORMAT_FIXTURE_H_
#define RESHARD_LIB_FORMATS_FORMAT_FIXTURE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"

namespace reshard {

// One damaged variant of a fixture: a file cut at `offset`, with the byte at `offset` flipped
// (its lowest bit), removed, or replaced by `replacement` (the same file of another save).
struct FixtureDamage {
  enum class Kind { kTruncate, kFlip, kRemove, kReplace };
  std::string label;  // "truncated inside data.pkl", for messages
  std::string file;   // relative to the fixture's folder
  Kind kind = Kind::kTruncate;
  uint64_t offset = 0;
  // The damage is in tensor data, which a checksum guards: reading may succeed (only metadata
  // is read), converting must fail with DATA_LOSS.
  bool in_checksummed_data = false;
  // The format cannot notice this damage (a flipped data byte of a format without checksums):
  // reading and converting succeed, and comparing the damaged input with the intact one must
  // report the tensors different.
  bool undetectable = false;
  // The damage leaves the input naming a file that does not exist (besides kRemove, a flipped
  // byte in a file name an index lists): NOT_FOUND.
  bool names_missing_file = false;
  // The one error code reading and converting must give. kOk: the default, NOT_FOUND for a
  // removed file or one the input names and lacks, DATA_LOSS for every other damage (bytes
  // cut off or changed). Set (ExpectDamageCode) where the format decides otherwise: DATA_LOSS
  // for a file missing from a multi-file save (an incomplete checkpoint), INVALID_ARGUMENT when
  // nothing left identifies the format.
  absl::StatusCode code = absl::StatusCode::kOk;
  // kReplace: the file's new bytes.
  std::string replacement;
  // When set, the error must name it (the file, usually), besides giving `code`.
  std::string named;
};

// A tensor of the model a fixture holds, as the reader must give it: row-major bytes.
struct FixtureTensor {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::string bytes;
};

// A fixture as written into a folder.
struct BuiltFixture {
  std::string input;  // what to give the reader: the folder, or a file inside it
  // The whole model (parts merged), every tensor under every name (tied ones too).
  std::vector<FixtureTensor> expected;
  std::vector<FixtureDamage> damages;
};

// Sets the code of the damage labelled `label` in `fixture` (aborts when there is none).
void ExpectDamageCode(BuiltFixture& fixture, const std::string& label, absl::StatusCode code);

// Writes a small checkpoint of one format into the existing, empty folder `dir`.
using FixtureBuilder = std::function<BuiltFixture(const std::string& dir)>;

// A format may register several fixtures (variants of its layout), each under its own name.
void RegisterFormatFixture(const std::string& format_id, const std::string& variant,
                           FixtureBuilder builder);

// The three tensors of distinct dtypes most fixtures hold, under `names`: F32 [4, 3] counting up
// from `first_f32`, BF16 [3] and I64 [2].
std::vector<FixtureTensor> ThreeFixtureTensors(const std::vector<std::string>& names,
                                               float first_f32 = 1.5f);

// Tensor bytes for fixtures: distinct, finite values (no NaN, which comparisons treat as equal
// to any other NaN), so that any changed byte changes a value.
std::string FixtureF32Bytes(int64_t count, float start);
std::string FixtureBF16Bytes(int64_t count, float start);  // the upper halves of F32 values
std::string FixtureI64Bytes(int64_t count, int64_t start);

struct RegisteredFixture {
  std::string format_id;
  std::string variant;  // "" for a format's only fixture
  FixtureBuilder builder;
};

// A fixture's name in parameterized test names: "<format id>[_<variant>]" with '-', '.' and
// '/' turned into '_'.
std::string FixtureTestName(const std::pair<std::string, std::string>& key);

// Every registered fixture, by format id then variant.
const std::map<std::pair<std::string, std::string>, RegisteredFixture>& FormatFixtures();

// For tests that convert a registered fixture: writes the fixture registered as `format_id`
// `variant` into an existing, empty folder and returns what to give the reader; "" and a test
// failure naming both when none is registered.
std::function<std::string(const std::string& dir)> RegisteredFixtureInput(
    const std::string& format_id, const std::string& variant = "");

struct FormatFixtureRegistration {
  FormatFixtureRegistration(const std::string& format_id, FixtureBuilder builder)
      : FormatFixtureRegistration(format_id, "", std::move(builder)) {}
  FormatFixtureRegistration(const std::string& format_id, const std::string& variant,
                            FixtureBuilder builder) {
    RegisterFormatFixture(format_id, variant, std::move(builder));
  }
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FORMAT_FIXTURE_H_
