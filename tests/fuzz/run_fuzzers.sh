#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a bounded time.
# Usage: tests/fuzz/run_fuzzers.sh [SECONDS_PER_TARGET]   (default 30)
# Exits non-zero if a target crashes; the crashing input is kept under $FUZZ_WORK/crashes.
set -euo pipefail

seconds="${1:-30}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="${FUZZ_WORK:-$(mktemp -d /tmp/reshard-fuzz.XXXXXX)}"
mkdir -p "$work/crashes"

absl_libs=(-labsl_statusor -labsl_status -labsl_cord -labsl_cordz_info -labsl_cordz_handle
  -labsl_cordz_functions -labsl_cord_internal -labsl_exponential_biased -labsl_strerror
  -labsl_str_format_internal -labsl_strings -labsl_strings_internal -labsl_synchronization
  -labsl_graphcycles_internal -labsl_malloc_internal -labsl_time -labsl_civil_time
  -labsl_time_zone -labsl_stacktrace -labsl_symbolize -labsl_debugging_internal
  -labsl_demangle_internal -labsl_bad_optional_access -labsl_bad_variant_access
  -labsl_int128 -labsl_throw_delegate -labsl_raw_logging_internal -labsl_log_severity
  -labsl_spinlock_wait -labsl_base)

build() {  # build NAME SOURCES...
  local name="$1"; shift
  clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$root" "$@" -o "$work/$name" "${absl_libs[@]}" -pthread
}

run() {  # run NAME SEED_DIR
  local name="$1" seeds="$2"
  mkdir -p "$work/corpus-$name"
  echo "fuzz: $name for ${seconds}s" >&2
  "$work/$name" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$work/crashes/$name-" -print_final_stats=1 \
    "$work/corpus-$name" "$seeds" 2> "$work/$name.log" || {
      tail -n 40 "$work/$name.log" >&2
      echo "fuzz: $name FAILED; inputs in $work/crashes" >&2
      return 1
    }
  grep -E "^stat::number_of_executed_units" "$work/$name.log" | sed "s/^/fuzz: $name /" >&2
}

/usr/bin/python3 "$root/tests/fuzz/make_seeds.py" "$work/seeds-safetensors"
build safetensors_header_fuzzer "$root/tests/fuzz/safetensors_header_fuzzer.cc" \
  "$root/lib/formats/safetensors/header.cc" "$root/lib/core/status.cc" \
  "$root/lib/core/dtype.cc" "$root/lib/core/shape.cc"
run safetensors_header_fuzzer "$work/seeds-safetensors"

/usr/bin/python3 "$root/tests/fuzz/make_torch_seeds.py" "$work/seeds-zip" "$work/seeds-pickle"
build zip_archive_fuzzer "$root/tests/fuzz/zip_archive_fuzzer.cc" \
  "$root/lib/formats/torch/zip_archive.cc" "$root/lib/core/status.cc" \
  -labsl_hash -labsl_city -labsl_low_level_hash -labsl_raw_hash_set
run zip_archive_fuzzer "$work/seeds-zip"
build pickle_fuzzer "$root/tests/fuzz/pickle_fuzzer.cc" \
  "$root/lib/formats/torch/pickle.cc" "$root/lib/core/status.cc" \
  -labsl_hash -labsl_city -labsl_low_level_hash -labsl_raw_hash_set
run pickle_fuzzer "$work/seeds-pickle"
build torch_archive_fuzzer "$root/tests/fuzz/torch_archive_fuzzer.cc" \
  "$root/lib/formats/torch/torch_file.cc" "$root/lib/formats/torch/zip_archive.cc" \
  "$root/lib/formats/torch/pickle.cc" "$root/lib/io/mapped_file.cc" \
  "$root/lib/core/status.cc" "$root/lib/core/dtype.cc" "$root/lib/core/shape.cc" \
  -labsl_hash -labsl_city -labsl_low_level_hash -labsl_raw_hash_set -lz
run torch_archive_fuzzer "$work/seeds-zip"
/usr/bin/python3 "$root/tests/fuzz/make_dcp_seeds.py" "$work/seeds-dcp"
build dcp_metadata_fuzzer "$root/tests/fuzz/dcp_metadata_fuzzer.cc" \
  "$root/lib/formats/dcp/dcp_metadata.cc" "$root/lib/formats/torch/torch_file.cc" \
  "$root/lib/formats/torch/zip_archive.cc" "$root/lib/formats/torch/pickle.cc" \
  "$root/lib/io/mapped_file.cc" "$root/lib/core/status.cc" "$root/lib/core/dtype.cc" \
  "$root/lib/core/shape.cc" \
  -labsl_hash -labsl_city -labsl_low_level_hash -labsl_raw_hash_set -lz
run dcp_metadata_fuzzer "$work/seeds-dcp"
echo "fuzz: all targets passed" >&2
