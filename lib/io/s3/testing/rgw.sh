#!/bin/bash
# Starts or stops a single-host Ceph 16.2 cluster for S3 tests: one monitor, one memstore OSD
# (data in RAM, at most 2 GiB or RGW_MEMSTORE_BYTES) and radosgw on 127.0.0.1, with user
# TESTKEY/TESTSECRET.
#   rgw.sh start BASE RGW_PORT MON_PORT   (about 15 s)
#   rgw.sh stop BASE                      (about 6 s)
# BASE must be short: Ceph's admin sockets live under it and Unix socket paths are limited to
# 107 bytes. Needs the packages of tools/setup.sh (ceph-mon ceph-osd radosgw ceph-common
# uuid-runtime). `ms mon client mode = crc` keeps radosgw from waiting 300 s for auth.
set -euo pipefail

stop() {
  local C=$1 P
  P=$(cat "$C"/run/client.rgw.a.pid "$C"/run/osd.0.pid "$C"/run/mon.a.pid 2>/dev/null || true)
  for p in $P; do kill "$p" 2>/dev/null || true; done
  for p in $P; do
    for _ in $(seq 1 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null || true
  done
}

start() {
  local C=$1 RGW_PORT=$2 MON_PORT=$3
  for tool in ceph-mon ceph-osd radosgw radosgw-admin ceph monmaptool uuidgen curl; do
    if ! command -v "$tool" >/dev/null; then
      echo "rgw.sh: $tool not found: run tools/setup.sh (installs ceph-mon ceph-osd radosgw" \
        "ceph-common uuid-runtime)" >&2
      exit 1
    fi
  done
  mkdir -p "$C"/{mon,osd0,run,log,rgw}
  local FSID H
  FSID=$(uuidgen)
  H=$(hostname -s)
  cat >"$C/ceph.conf" <<CONF
[global]
fsid = $FSID
mon host = 127.0.0.1:$MON_PORT
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
ms client mode = crc
ms bind ipv6 = false
public network = 127.0.0.0/8
run dir = $C/run
log file = $C/log/\$name.log
admin socket = $C/run/\$name.asok
pid file = $C/run/\$name.pid
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
osd crush chooseleaf type = 0
mon warn on pool no redundancy = false
[mon.a]
mon data = $C/mon
[osd]
osd data = $C/osd\$id
osd objectstore = memstore
memstore device bytes = ${RGW_MEMSTORE_BYTES:-2147483648}
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT
rgw data = $C/rgw
CONF
  local CC="-c $C/ceph.conf" ID
  monmaptool --create --add a "127.0.0.1:$MON_PORT" --fsid "$FSID" "$C/monmap" >/dev/null
  ceph-mon $CC --mkfs -i a --monmap "$C/monmap"
  ceph-mon $CC -i a
  ID=$(timeout 30 ceph $CC osd create)
  ceph-osd $CC -i "$ID" --mkfs 2>/dev/null
  ceph $CC osd crush add-bucket "$H" host >/dev/null
  ceph $CC osd crush move "$H" root=default >/dev/null
  ceph $CC osd crush add "osd.$ID" 1.0 host="$H" >/dev/null
  ceph-osd $CC -i "$ID"
  for _ in $(seq 1 60); do ceph $CC osd stat 2>/dev/null | grep -q '1 up' && break; sleep 0.5; done
  radosgw $CC -n client.rgw.a --client-mount-timeout 30
  local up=0
  for _ in $(seq 1 120); do
    if curl -s -o /dev/null "http://127.0.0.1:$RGW_PORT/"; then up=1; break; fi
    sleep 0.5
  done
  if [ "$up" != 1 ]; then
    echo "rgw.sh: radosgw did not answer on 127.0.0.1:$RGW_PORT; logs in $C/log" >&2
    exit 1
  fi
  radosgw-admin $CC user create --uid=test --display-name=test --access-key=TESTKEY \
    --secret=TESTSECRET >/dev/null
}

case "${1:-}" in
  start) start "${2:?base}" "${3:?rgw port}" "${4:?mon port}" ;;
  stop) stop "${2:?base}" ;;
  *) echo "usage: rgw.sh start BASE RGW_PORT MON_PORT | stop BASE" >&2; exit 2 ;;
esac
