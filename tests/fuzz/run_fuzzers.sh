#!/usr/bin/env bash
# Builds the libFuzzer targets (reshard_fuzzer in the BUILD files beside the code they fuzz) with
# `bazel build --config=fuzz` (clang, libFuzzer + ASan + UBSan, see .bazelrc) and runs each for
# a bounded time on its seed corpus.
# Usage: tests/fuzz/run_fuzzers.sh [SECONDS_PER_TARGET]   (default 30)
# Exits non-zero if a target fails to build or crashes; the crashing input is kept under
# $FUZZ_WORK/crashes.
set -euo pipefail

seconds="${1:-30}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
work="${FUZZ_WORK:-$(mktemp -d /tmp/reshard-fuzz.XXXXXX)}"
mkdir -p "$work/crashes"

# target -> seed corpus (made below).
targets=(
  "//lib/formats/safetensors:header_fuzzer seeds-safetensors"
  "//lib/formats/torch:zip_archive_fuzzer seeds-zip"
  "//lib/formats/torch:pickle_fuzzer seeds-pickle"
  "//lib/formats/torch:torch_archive_fuzzer seeds-zip"
  "//lib/formats/dcp:dcp_metadata_fuzzer seeds-dcp"
  "//lib/formats/olmo:olmo_keys_fuzzer seeds-olmo"
  "//lib/formats/colossalai:colossalai_meta_fuzzer seeds-colossalai"
  "//lib/formats/fsdp:dtensor_fuzzer seeds-dtensor"
  "//lib/formats/fsdp:sharded_tensor_fuzzer seeds-sharded-tensor"
  "//lib/formats/fsdp:flat_param_fuzzer seeds-flat-param"
  "//lib/io/s3:s3_xml_fuzzer seeds-s3xml"
  "//lib/formats/nemo:tar_archive_fuzzer seeds-tar"
  "//lib/formats/nemo:yaml_subset_fuzzer seeds-yaml"
  "//lib/formats/nemo:nemo_io_json_fuzzer seeds-iojson"
  "//lib/formats/hf:sentencepiece_model_fuzzer seeds-spm"
)

# Every reshard_fuzzer target must be listed above.
listed=$(printf '%s\n' "${targets[@]}" | cut -d' ' -f1 | sort)
declared=$(bazel query 'attr(tags, "\bfuzzer\b", kind(cc_binary, //...))' 2>/dev/null | sort)
if [ "$listed" != "$declared" ]; then
  echo "fuzz: run_fuzzers.sh lists: $(echo $listed); the BUILD files declare: $(echo $declared)" >&2
  exit 1
fi

/usr/bin/python3 tests/fuzz/make_seeds.py "$work/seeds-safetensors"
/usr/bin/python3 tests/fuzz/make_torch_seeds.py "$work/seeds-zip" "$work/seeds-pickle"
/usr/bin/python3 tests/fuzz/make_dcp_seeds.py "$work/seeds-dcp"
/usr/bin/python3 tests/fuzz/make_key_meta_seeds.py "$work/seeds-olmo" "$work/seeds-colossalai"
/usr/bin/python3 tests/fuzz/make_nemo_seeds.py "$work/seeds-tar" "$work/seeds-yaml" "$work/seeds-iojson" \
  "$work/seeds-spm"
/usr/bin/python3 tests/fuzz/make_dtensor_seeds.py "$work/seeds-dtensor"
/usr/bin/python3 tests/fuzz/make_sharded_tensor_seeds.py "$work/seeds-sharded-tensor"
/usr/bin/python3 tests/fuzz/make_flat_param_seeds.py "$work/seeds-flat-param"
# S3 answers (two leading bytes pick the HTTP status): an error, a listing, an upload.
mkdir -p "$work/seeds-s3xml"
printf '\x02\x03<?xml version="1.0"?><Error><Code>NoSuchKey</Code><Message>The key &amp; &lt;x&gt;</Message><RequestId>tx1</RequestId></Error>' >"$work/seeds-s3xml/error"
printf '\x00\x00<ListBucketResult><Contents><Key>a/b.safetensors</Key><Size>123</Size></Contents><IsTruncated>true</IsTruncated><NextContinuationToken>t&quot;</NextContinuationToken></ListBucketResult>' >"$work/seeds-s3xml/list"
printf '\x00\x00<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>2~abc</UploadId></InitiateMultipartUploadResult>' >"$work/seeds-s3xml/upload"

# The fuzz build's convenience links are bazel-fuzz-* (.bazelrc), so bazel-bin keeps pointing at
# the normal build (bazel-bin/client/reshardctl, the Python client's PYTHONPATH).
bazel_bin_before="$(readlink bazel-bin || true)"
bazel build --config=fuzz $listed 2> "$work/build.log" || {
  tail -n 40 "$work/build.log" >&2
  echo "fuzz: build FAILED" >&2
  exit 1
}
if [ "$(readlink bazel-bin || true)" != "$bazel_bin_before" ]; then
  echo "fuzz: the fuzz build moved bazel-bin from ${bazel_bin_before:-nothing} to" \
    "$(readlink bazel-bin); .bazelrc's build:fuzz needs --symlink_prefix=bazel-fuzz-" >&2
  exit 1
fi
bin="$(bazel info --config=fuzz bazel-bin 2>/dev/null)"

run() {  # run TARGET SEED_DIR
  local target="$1" seeds="$2"
  local name="${target##*:}"
  local exe="$bin/$(echo "${target#//}" | tr ':' '/')"
  mkdir -p "$work/corpus-$name"
  echo "fuzz: $name for ${seconds}s" >&2
  "$exe" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$work/crashes/$name-" -print_final_stats=1 \
    "$work/corpus-$name" "$seeds" 2> "$work/$name.log" || {
      tail -n 40 "$work/$name.log" >&2
      echo "fuzz: $name FAILED; inputs in $work/crashes" >&2
      return 1
    }
  grep -E "^stat::number_of_executed_units" "$work/$name.log" | sed "s/^/fuzz: $name /" >&2
}

status=0
for entry in "${targets[@]}"; do
  read -r target seeds <<< "$entry"
  run "$target" "$work/$seeds" || status=1
done
[ "$status" -eq 0 ] && echo "fuzz: all targets passed" >&2
exit "$status"
