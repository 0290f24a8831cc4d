#!/bin/bash
# Runs s3_client_rgw_test_bin against a real Ceph radosgw started here (testing/rgw.sh) and
# through testing/flaky_proxy.py. Ports are chosen at run time; the cluster lives under a short
# /tmp folder (Unix socket path limit) and is stopped on exit. Missing Ceph packages fail the
# test (they are installed by tools/setup.sh); nothing is skipped.
set -euo pipefail

here="${TEST_SRCDIR:-$(cd "$(dirname "$0")/../../../.." && pwd)}/${TEST_WORKSPACE:-reshard}/lib/io/s3"
[ -x "$here/s3_client_rgw_test_bin" ] || here="$(cd "$(dirname "$0")" && pwd)"

for tool in ceph-mon ceph-osd radosgw radosgw-admin ceph monmaptool uuidgen curl /usr/bin/python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAIL: $tool not found. Run tools/setup.sh (installs ceph-mon ceph-osd radosgw" \
      "ceph-common uuid-runtime) to run the radosgw tests." >&2
    exit 1
  fi
done

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

base=$(mktemp -d /tmp/rgw.XXXXXX)
proxy_pid=""
cleanup() {
  [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null || true
  "$here/testing/rgw.sh" stop "$base" >/dev/null 2>&1 || true
  if [ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ] && [ -d "$base/log" ]; then
    cp -r "$base/log" "$TEST_UNDECLARED_OUTPUTS_DIR/ceph-logs" 2>/dev/null || true
  fi
  rm -rf "$base"
}
trap cleanup EXIT

rgw_port=$(free_port)
mon_port=$(free_port)
while [ "$mon_port" = "$rgw_port" ]; do mon_port=$(free_port); done
start=$(date +%s)
"$here/testing/rgw.sh" start "$base" "$rgw_port" "$mon_port"
echo "radosgw up on 127.0.0.1:$rgw_port after $(($(date +%s) - start)) s"

/usr/bin/python3 "$here/testing/flaky_proxy.py" "$rgw_port" "$base/proxy.port" \
  "$base/proxy.stats" 4 5 &
proxy_pid=$!
for _ in $(seq 1 50); do [ -s "$base/proxy.port" ] && break; sleep 0.1; done
[ -s "$base/proxy.port" ] || { echo "FAIL: flaky_proxy.py did not start" >&2; exit 1; }

export S3_TEST_ENDPOINT="http://127.0.0.1:$rgw_port"
export S3_TEST_PROXY_ENDPOINT="http://127.0.0.1:$(cat "$base/proxy.port")"
export S3_TEST_PROXY_STATS="$base/proxy.stats"
"$here/s3_client_rgw_test_bin" "$@"
