// Google Benchmark of ConvertElements, single thread, 16 MiB of output per call.
//
//   bazel run -c opt //lib/exec:dtype_convert_benchmark -- --benchmark_repetitions=15
//     --benchmark_enable_random_interleaving=true --benchmark_min_time=0.2
//
// Throughput counts the SOURCE bytes of the elements converted, count * sizeof(source element):
// neither the destination bytes nor, for the strided case, the source bytes skipped between
// elements. `bytes_per_second` prints it in binary units (G/s = GiB/s), `src_GB/s` in decimal
// GB/s (docs/benchmarks.md). So F32 -> BF16 at 8 GB/s is 2 G elements per second (8 GB read,
// 4 GB written). Both are per CPU second.
//
// Inputs are F32 values of a model's weight range (normal, sigma 0.02, a few larger), narrowed
// to BF16 / F16 bits for the widening cases; no NaN, so the scalar paths see their common branch.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "lib/exec/dtype_convert.h"

namespace reshard {
namespace {

constexpr size_t kOutputBytes = size_t{16} << 20;

std::vector<uint32_t> WeightLikeF32Bits(size_t count) {
  std::mt19937 rng(7);
  std::normal_distribution<float> weight(0.0f, 0.02f);
  std::vector<uint32_t> bits(count);
  for (size_t i = 0; i < count; ++i) {
    float f = weight(rng);
    if (i % 64 == 0) f *= 1000.0f;  // some values far from zero
    std::memcpy(&bits[i], &f, 4);
  }
  return bits;
}

// Source of `count` elements of `src` dtype placed every `stride` elements.
std::vector<std::byte> MakeSource(DType src, size_t count, int64_t stride) {
  const std::vector<uint32_t> f32 = WeightLikeF32Bits(count);
  const size_t size = DTypeSize(src);
  std::vector<std::byte> out(count * static_cast<size_t>(stride) * size);
  for (size_t i = 0; i < count; ++i) {
    std::byte* p = out.data() + i * static_cast<size_t>(stride) * size;
    if (src == DType::kF32) {
      std::memcpy(p, &f32[i], 4);
    } else {
      const uint16_t h = src == DType::kBF16 ? F32BitsToBF16Bits(f32[i]) : F32BitsToF16Bits(f32[i]);
      std::memcpy(p, &h, 2);
    }
  }
  return out;
}

void BM_Convert(benchmark::State& state, DType src, DType dst, int64_t stride) {
  const size_t count = kOutputBytes / DTypeSize(dst);
  const std::vector<std::byte> source = MakeSource(src, count, stride);
  std::vector<std::byte> dest(kOutputBytes);
  for (auto _ : state) {
    ConvertElements(source.data(), stride, src, dest.data(), dst, static_cast<int64_t>(count));
    benchmark::DoNotOptimize(dest.data());
    benchmark::ClobberMemory();
  }
  const int64_t source_bytes = static_cast<int64_t>(count * DTypeSize(src));
  state.SetBytesProcessed(state.iterations() * source_bytes);
  state.counters["src_GB/s"] = benchmark::Counter(static_cast<double>(source_bytes),
                                                  benchmark::Counter::kIsIterationInvariantRate,
                                                  benchmark::Counter::kIs1000);
}

BENCHMARK_CAPTURE(BM_Convert, f32_to_bf16, DType::kF32, DType::kBF16, 1);
BENCHMARK_CAPTURE(BM_Convert, f32_to_f16, DType::kF32, DType::kF16, 1);
BENCHMARK_CAPTURE(BM_Convert, bf16_to_f32, DType::kBF16, DType::kF32, 1);
BENCHMARK_CAPTURE(BM_Convert, f16_to_f32, DType::kF16, DType::kF32, 1);
BENCHMARK_CAPTURE(BM_Convert, f32_to_f32_memcpy, DType::kF32, DType::kF32, 1);
BENCHMARK_CAPTURE(BM_Convert, f32_to_bf16_stride2, DType::kF32, DType::kBF16, 2);

}  // namespace
}  // namespace reshard

BENCHMARK_MAIN();
