#!/usr/bin/python3
"""An HTTP/1.1 proxy in front of radosgw that fails some requests, for S3 retry tests.

Requests are counted in arrival order (1, 2, ...). Request n is
  - answered "503 SlowDown" when n % FAIL_EVERY == 1,
  - dropped (the connection closed with no answer) when n % DROP_EVERY == 2,
  - otherwise forwarded to the upstream on a fresh connection with "Connection: close", and the
    answer relayed back; the client connection is closed after each answer.
The proxy writes its port to PORT_FILE once listening and, after every request, the counts
{"requests", "failed_503", "dropped", "forwarded", "forwarded_range_gets",
"forwarded_range_bytes"} as JSON to STATS_FILE (the last two: forwarded GETs with a Range
header, i.e. the client's range reads, and the bytes their "bytes=a-b" ranges ask for).

Usage: flaky_proxy.py UPSTREAM_PORT PORT_FILE STATS_FILE [FAIL_EVERY] [DROP_EVERY]
"""

import json
import os
import socket
import sys
import threading

UPSTREAM_PORT = int(sys.argv[1])
PORT_FILE, STATS_FILE = sys.argv[2], sys.argv[3]
FAIL_EVERY = int(sys.argv[4]) if len(sys.argv) > 4 else 4
DROP_EVERY = int(sys.argv[5]) if len(sys.argv) > 5 else 5

lock = threading.Lock()
stats = {"requests": 0, "failed_503": 0, "dropped": 0, "forwarded": 0, "forwarded_range_gets": 0,
         "forwarded_range_bytes": 0}

SLOW_DOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>"
             b"<Message>Please reduce your request rate.</Message></Error>")


def write_stats():
    tmp = STATS_FILE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(stats, f)
    os.replace(tmp, STATS_FILE)


def read_request(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    length = 0
    kept = [lines[0]]
    for line in lines[1:]:
        name = line.split(b":", 1)[0].strip().lower()
        if name == b"content-length":
            length = int(line.split(b":", 1)[1])
        if name in (b"connection", b"keep-alive"):
            continue
        kept.append(line)
    kept.append(b"Connection: close")
    while len(rest) < length:
        chunk = conn.recv(min(1 << 20, length - len(rest)))
        if not chunk:
            return None
        rest += chunk
    return b"\r\n".join(kept) + b"\r\n\r\n" + rest


def range_bytes(head):
    """The bytes the "Range: bytes=a-b" header of lower-cased request head `head` asks for."""
    value = head.split(b"\r\nrange:", 1)[1].split(b"\r\n", 1)[0].strip()
    first, _, last = value[len(b"bytes="):].partition(b"-")
    return int(last) - int(first) + 1 if first and last else 0


def handle(conn):
    with conn:
        request = read_request(conn)
        if request is None:
            return
        with lock:
            stats["requests"] += 1
            n = stats["requests"]
            if n % FAIL_EVERY == 1:
                action = "failed_503"
            elif n % DROP_EVERY == 2:
                action = "dropped"
            else:
                action = "forwarded"
            stats[action] += 1
            head = request.split(b"\r\n\r\n", 1)[0].lower()
            if action == "forwarded" and head.startswith(b"get ") and b"\r\nrange:" in head:
                stats["forwarded_range_gets"] += 1
                stats["forwarded_range_bytes"] += range_bytes(head)
            write_stats()
        if action == "dropped":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            return
        if action == "failed_503":
            conn.sendall(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(SLOW_DOWN) +
                         SLOW_DOWN)
            return
        with socket.create_connection(("127.0.0.1", UPSTREAM_PORT)) as up:
            up.sendall(request)
            while True:
                chunk = up.recv(1 << 20)
                if not chunk:
                    break
                conn.sendall(chunk)


def main():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    write_stats()
    with open(PORT_FILE + ".tmp", "w") as f:
        f.write(str(server.getsockname()[1]))
    os.replace(PORT_FILE + ".tmp", PORT_FILE)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
