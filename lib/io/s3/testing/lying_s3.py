#!/usr/bin/python3
"""A fake S3 server on 127.0.0.1 that lies on demand, for tests of the S3 client's checks.

It serves the files under ROOT as objects (s3://BUCKET/KEY is ROOT/BUCKET/KEY), path-style,
to HEAD, GET (with or without "Range: bytes=A-B") and ListObjectsV2 (one page, prefix and
delimiter "/"), and ignores signatures. Every object's
ETag is the quoted MD5 of its bytes. MODE says how it answers a range GET that does not start
at byte 0 (the reads after a header; HEAD and GETs at 0 are answered honestly, so that readers
get as far as their data):
  honest        206 with the range asked for;
  other-range   206 with the right length but the range one byte earlier, named so in
                Content-Range ("bytes A-1-B-1/TOTAL") and sent;
  short-length  206 naming the range asked for, Content-Length one byte short of the body it
                sends (then the connection is closed);
  full-200      200 with the whole object (the server ignores Range);
  replaced      the object is replaced by a new version (every byte + 1, its own ETag) when
                the first such GET arrives: that GET and all requests after it (HEAD too) see
                the new version, and a GET whose If-Match names another ETag is answered 412
                PreconditionFailed;
  replaced-no-if-match   as replaced, but If-Match is ignored (206 of the new version);
  replaced-at-head-N     the object is replaced by the new version (same size) when the N-th
                HEAD of an existing object arrives: that HEAD and all requests after it see the
                new version; answers are honest (a job's metadata read under one version, its
                data opened under another);
  drip          206 naming the range asked for, its body 100 bytes every 100 ms;
  silent        reads the request and never answers (the connection stays open).
The port is written to PORT_FILE once the server listens; after each request the count of
requests per method is written to PORT_FILE.stats as JSON ({"HEAD": 1, "GET": 3}).

Usage: lying_s3.py ROOT PORT_FILE MODE
"""

import hashlib
import http.server
import json
import os
import socketserver
import sys
import threading
import time
import urllib.parse
from xml.sax.saxutils import escape

ROOT, PORT_FILE, MODE = sys.argv[1], sys.argv[2], sys.argv[3]
MODES = ("honest", "other-range", "short-length", "full-200", "replaced", "replaced-no-if-match",
         "drip", "silent")
REPLACED_AT_HEAD = (int(MODE[len("replaced-at-head-"):])
                    if MODE.startswith("replaced-at-head-") and MODE[17:].isdigit() else 0)
if MODE not in MODES and REPLACED_AT_HEAD == 0:
    sys.exit("lying_s3.py: unknown mode %r (one of %s, replaced-at-head-N)"
             % (MODE, ", ".join(MODES)))

lock = threading.Lock()
counts = {}
never = threading.Event()
replaced = threading.Event()
heads = [0]  # HEADs of existing objects, for replaced-at-head-N


def count(method):
    with lock:
        counts[method] = counts.get(method, 0) + 1
        with open(PORT_FILE + ".stats.tmp", "w") as f:
            json.dump(counts, f)
        os.replace(PORT_FILE + ".stats.tmp", PORT_FILE + ".stats")


def etag(data):
    return '"%s"' % hashlib.md5(data).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def object(self):
        root = os.path.abspath(ROOT)
        path = os.path.normpath(os.path.join(root, self.path.split("?", 1)[0].lstrip("/")))
        if not path.startswith(root + os.sep) or not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            data = f.read()
        return bytes((b + 1) % 256 for b in data) if replaced.is_set() else data

    def answer(self, status, headers, body=b"", sent=None):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if sent is None:
            self.wfile.write(body)
        else:
            sent(body)

    def not_found(self):
        body = b"<Error><Code>NoSuchKey</Code><Message>no such key</Message></Error>"
        self.answer(404, [("Content-Length", str(len(body)))], body)

    def do_HEAD(self):
        count("HEAD")
        data = self.object()
        if data is None:
            self.answer(404, [("Content-Length", "0")])
            return
        if REPLACED_AT_HEAD > 0:
            with lock:
                heads[0] += 1
                if heads[0] == REPLACED_AT_HEAD:
                    replaced.set()
            data = self.object()
        self.answer(200, [("Content-Length", str(len(data))), ("ETag", etag(data))])

    def list_objects(self, bucket, query):
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        base = os.path.join(os.path.abspath(ROOT), bucket)
        keys = []
        for folder, _, files in os.walk(base):
            for name in files:
                keys.append(os.path.relpath(os.path.join(folder, name), base))
        contents, prefixes = [], set()
        for key in sorted(k for k in keys if k.startswith(prefix)):
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            if cut >= 0:
                prefixes.add(key[:cut + 1])
                continue
            with open(os.path.join(base, key), "rb") as f:
                data = f.read()
            contents.append("<Contents><Key>%s</Key><Size>%d</Size><ETag>%s</ETag></Contents>"
                            % (escape(key), len(data), escape(etag(data))))
        body = ("<ListBucketResult><IsTruncated>false</IsTruncated>%s%s</ListBucketResult>" % (
            "".join(contents),
            "".join("<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>" % escape(p)
                    for p in sorted(prefixes)))).encode()
        self.answer(200, [("Content-Length", str(len(body)))], body)

    def do_GET(self):
        count("GET")
        path, _, query = self.path.partition("?")
        if "/" not in path.strip("/"):
            self.list_objects(path.strip("/"), urllib.parse.parse_qs(query))
            return
        data = self.object()
        if data is None:
            self.not_found()
            return
        spec = self.headers.get("Range", "")
        if not spec.startswith("bytes="):
            self.answer(200, [("Content-Length", str(len(data))), ("ETag", etag(data))], data)
            return
        first, last = (int(v) for v in spec[len("bytes="):].split("-"))
        last = min(last, len(data) - 1)
        mode = MODE if first > 0 else "honest"
        if mode == "silent":
            never.wait()
            return
        if mode in ("replaced", "replaced-no-if-match"):
            if not replaced.is_set():
                replaced.set()
                data = bytes((b + 1) % 256 for b in data)
            if mode == "replaced" and self.headers.get("If-Match") not in (None, etag(data)):
                body = (b"<Error><Code>PreconditionFailed</Code><Message>At least one of the "
                        b"pre-conditions you specified did not hold</Message></Error>")
                self.answer(412, [("Content-Length", str(len(body)))], body)
                return
        if mode == "full-200":
            self.answer(200, [("Content-Length", str(len(data))), ("ETag", etag(data))], data)
            return
        if mode == "other-range":
            first, last = first - 1, last - 1
        body = data[first:last + 1]
        headers = [("Content-Range", "bytes %d-%d/%d" % (first, last, len(data))),
                   ("ETag", etag(data))]
        if mode == "short-length":
            headers.append(("Content-Length", str(len(body) - 1)))
            headers.append(("Connection", "close"))
            self.close_connection = True
        else:
            headers.append(("Content-Length", str(len(body))))
        if mode == "drip":
            def drip(body):
                for i in range(0, len(body), 100):
                    self.wfile.write(body[i:i + 100])
                    self.wfile.flush()
                    time.sleep(0.1)
            self.answer(206, headers, body, sent=drip)
            return
        self.answer(206, headers, body)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def main():
    server = Server(("127.0.0.1", 0), Handler)
    with open(PORT_FILE + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(PORT_FILE + ".tmp", PORT_FILE)
    server.serve_forever()


if __name__ == "__main__":
    main()
