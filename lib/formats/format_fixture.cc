#include "lib/formats/format_fixture.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

std::map<std::pair<std::string, std::string>, RegisteredFixture>& Registry() {
  static auto* registry = new std::map<std::pair<std::string, std::string>, RegisteredFixture>();
  return *registry;
}

}  // namespace

void ExpectDamageCode(BuiltFixture& fixture, const std::string& label, absl::StatusCode code) {
  for (FixtureDamage& damage : fixture.damages) {
    if (damage.label == label) {
      damage.code = code;
      return;
    }
  }
  std::fprintf(stderr, "ExpectDamageCode: no damage labelled \"%s\"\n", label.c_str());
  std::abort();
}

void RegisterFormatFixture(const std::string& format_id, const std::string& variant,
                           FixtureBuilder builder) {
  const bool inserted = Registry()
                            .emplace(std::make_pair(format_id, variant),
                                     RegisteredFixture{format_id, variant, std::move(builder)})
                            .second;
  if (!inserted) {  // before main: nothing to report a test failure to
    std::fprintf(stderr, "two fixtures registered for format %s, variant \"%s\"\n",
                 format_id.c_str(), variant.c_str());
    std::abort();
  }
}

std::string FixtureF32Bytes(int64_t count, float start) {
  std::string out(count * 4, '\0');
  for (int64_t i = 0; i < count; ++i) {
    const float value = start + 0.25f * static_cast<float>(i);
    std::memcpy(&out[i * 4], &value, 4);
  }
  return out;
}

std::string FixtureBF16Bytes(int64_t count, float start) {
  const std::string f32 = FixtureF32Bytes(count, start);
  std::string out;
  for (int64_t i = 0; i < count; ++i) out.append(f32, i * 4 + 2, 2);  // little-endian
  return out;
}

std::string FixtureI64Bytes(int64_t count, int64_t start) {
  std::string out(count * 8, '\0');
  for (int64_t i = 0; i < count; ++i) {
    const int64_t value = start + 3 * i;
    std::memcpy(&out[i * 8], &value, 8);
  }
  return out;
}

std::vector<FixtureTensor> ThreeFixtureTensors(const std::vector<std::string>& names,
                                               float first_f32) {
  return {{names.at(0), DType::kF32, {4, 3}, FixtureF32Bytes(12, first_f32)},
          {names.at(1), DType::kBF16, {3}, FixtureBF16Bytes(3, -2.0f)},
          {names.at(2), DType::kI64, {2}, FixtureI64Bytes(2, 7)}};
}

const std::map<std::pair<std::string, std::string>, RegisteredFixture>& FormatFixtures() {
  return Registry();
}

std::function<std::string(const std::string& dir)> RegisteredFixtureInput(
    const std::string& format_id, const std::string& variant) {
  return [format_id, variant](const std::string& dir) -> std::string {
    const auto it = Registry().find({format_id, variant});
    if (it == Registry().end()) {
      ADD_FAILURE() << "no fixture registered for format " << format_id << " \"" << variant << "\"";
      return "";
    }
    return it->second.builder(dir).input;
  };
}

std::string FixtureTestName(const std::pair<std::string, std::string>& key) {
  const std::string name =
      key.second.empty() ? key.first : absl::StrCat(key.first, "_", key.second);
  return absl::StrReplaceAll(name, {{"-", "_"}, {".", "_"}, {"/", "_"}});
}

}  // namespace reshard
