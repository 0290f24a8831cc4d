#!/usr/bin/env bash
# Installs every Debian package reshard needs to build, test, benchmark and run its demo.
# Idempotent: packages already present are left alone. Safe to call from every entry point.
set -euo pipefail

packages=(
  # Build: Bazel 4 from Debian plus the platforms repository it needs offline.
  bazel-bootstrap bazel-platforms g++ clang libclang-rt-14-dev lld-14
  # Libraries linked through third_party/system.BUILD.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
  libsqlite3-dev libxxhash-dev libcli11-dev libre2-dev zlib1g-dev libisal-dev libssl-dev
  # Independent readers for the tests and the benchmark's peak-RSS figures.
  python3 python3-numpy python3-torch time
  # A real Prometheus (and promtool) for tests/observability; python3-yaml reads the rules.
  prometheus python3-yaml
  # A real Slurm (slurmctld + slurmd on 127.0.0.1) for the partitioned-job test.
  slurm-wlm munge
  # openssl(1) makes the CA and certificates of the TLS tests at test time.
  openssl
  # The Python client (clients/python; stubs from protobuf-compiler-grpc's grpc_python_plugin)
  # and a real workflow engine for tests/workflows.
  python3-grpcio python3-protobuf snakemake
  # S3: libcurl for lib/io/s3 and a real single-host Ceph radosgw for //lib/io/s3:s3_client_rgw_test.
  libcurl4-openssl-dev ceph-mon ceph-osd radosgw ceph-common uuid-runtime
)

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
