// main() of a fuzz target built without --config=fuzz (see fuzz.bzl): feeds each file named on
// the command line to LLVMFuzzerTestOneInput once, so a crashing input can be replayed under a
// debugger from the normal build.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "cannot read %s\n", argv[i]);
      return 1;
    }
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    std::fprintf(stderr, "ran %s (%zu bytes)\n", argv[i], bytes.size());
  }
  return 0;
}
