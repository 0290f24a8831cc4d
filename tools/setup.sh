#!/usr/bin/env bash
# Installs every Debian package reshard needs to build, test, benchmark and run its demo.
# Idempotent: packages already present are left alone. Safe to call from every entry point.
set -euo pipefail

# The demo needs the build and the demo's own checks; the tests need the rest as well.
#   tools/setup.sh          everything (tools/test.sh, benchmarks)
#   tools/setup.sh demo     only what tools/demo.sh needs (no Ceph, Slurm, Prometheus, clang)
demo_packages=(
  # Build: Bazel 4 from Debian plus the platforms repository it needs offline.
  bazel-bootstrap bazel-platforms g++
  # Libraries linked through third_party/system.BUILD (libcurl is loaded on demand for s3://).
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev nlohmann-json3-dev libsqlite3-dev libxxhash-dev libcli11-dev libre2-dev
  zlib1g-dev libisal-dev libssl-dev libcurl4-openssl-dev
  # The demo's fixtures and its independent check of the outputs (numpy and real PyTorch).
  python3 python3-numpy python3-torch
)
test_packages=(
  # Fuzzers (clang, libFuzzer, sanitizers) and the C++ test and benchmark libraries.
  clang libclang-rt-14-dev lld-14 libgtest-dev libgmock-dev libbenchmark-dev
  # GNU time for the benchmarks' and tests' peak-RSS figures.
  time
  # A real Prometheus (and promtool) for tests/observability; python3-yaml reads the rules.
  prometheus python3-yaml
  # A real Slurm (slurmctld + slurmd on 127.0.0.1) for the partitioned-job test.
  slurm-wlm munge
  # openssl(1) makes the CA and certificates of the TLS tests at test time.
  openssl
  # The Python client (clients/python; stubs from protobuf-compiler-grpc's grpc_python_plugin)
  # and a real workflow engine for tests/workflows.
  python3-grpcio python3-protobuf snakemake
  # A real single-host Ceph radosgw for the S3 tests.
  ceph-mon ceph-osd radosgw ceph-common uuid-runtime
)

case "${1:-all}" in
  demo) packages=("${demo_packages[@]}") ;;
  all) packages=("${demo_packages[@]}" "${test_packages[@]}") ;;
  *) echo "usage: tools/setup.sh [all|demo]" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
