#!/usr/bin/python3
"""reshardctl consolidate s3://... against lib/io/s3/testing/lying_s3.py, a fake S3 server on
127.0.0.1 that lies on demand (no Ceph needed).

The input is a 2 MiB safetensors object written here. Its header is read with a range GET at
byte 0, which the server answers honestly in every mode; its data is read with range GETs
that do not start at 0, which it answers according to its mode. Honestly answered, the
consolidation is byte-equal to the local one's. An answer naming the range one byte earlier
(the right length: taken at its word it would shift every tensor by a byte) must fail with
DATA_LOSS, and an object replaced between the header and the data with FAILED_PRECONDITION,
each naming the object and the offset and publishing nothing; an object replaced by one of the
same size after its header was read, before the conversion opens it, with FAILED_PRECONDITION
naming it and both ETags.

Usage: s3_lying_server_test.py --reshardctl PATH --lying-s3 PATH [unittest args]
"""

import filecmp
import hashlib
import json
import os
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import harness  # noqa: E402

BUCKET = "models"


def write_safetensors(path):
    """Two F32 tensors of 1 MiB and 0.5 MiB with position-dependent values."""
    tensors = [("a.weight", (512, 512)), ("b.weight", (256, 512))]
    header, blobs, offset = {}, [], 0
    for index, (name, shape) in enumerate(tensors):
        count = shape[0] * shape[1]
        blob = struct.pack("<%df" % count, *(float(i * 3 + index) for i in range(count)))
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


class LyingServerTest(harness.CliTestCase):
    TMP_PREFIX = "reshard-s3-lies"

    def start(self, mode):
        """Starts lying_s3.py in `mode` over self.p("root"); returns the environment to run
        reshardctl with."""
        os.makedirs(self.p("root", BUCKET))
        write_safetensors(self.p("root", BUCKET, "model.safetensors"))
        port_file = self.p("port")
        server = subprocess.Popen(
            ["/usr/bin/python3", harness.BINARIES["lying-s3"], self.p("root"), port_file, mode],
            stderr=subprocess.DEVNULL)
        self.addCleanup(server.wait)
        self.addCleanup(server.kill)
        deadline = time.monotonic() + 20
        while not os.path.exists(port_file):
            self.assertIsNone(server.poll(), "lying_s3.py exited")
            self.assertLess(time.monotonic(), deadline, "lying_s3.py did not start")
            time.sleep(0.02)
        with open(port_file) as f:
            port = int(f.read())
        os.makedirs(self.p("home"))
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.p("home"),
                "AWS_ENDPOINT_URL": "http://127.0.0.1:%d" % port,
                "AWS_ACCESS_KEY_ID": "TESTKEY", "AWS_SECRET_ACCESS_KEY": "TESTSECRET",
                "AWS_REGION": "us-east-1"}

    def consolidate(self, env, out):
        cmd = [RESHARDCTL, "consolidate", "s3://%s/model.safetensors" % BUCKET, out,
               "--no-progress", "--result-file", out + ".result.json"]
        res = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             timeout=60)
        res.cmd = cmd
        res.stdout_text = res.stdout.decode("utf-8", "replace")
        res.stderr_text = res.stderr.decode("utf-8", "replace")
        res.text = res.stdout_text + res.stderr_text
        return res

    def error(self, out):
        """The error of the --result-file document: (code, message)."""
        with open(out + ".result.json") as f:
            doc = json.load(f)
        self.assertFalse(doc["ok"])
        return doc["error"]["code"], doc["error"]["message"]

    def assertNothingPublished(self, out):
        self.assertFalse(os.path.exists(out), out)
        self.assertEqual([n for n in os.listdir(self.tmp) if n.startswith(".out")], [])

    def test_honest_answers_give_the_local_output(self):
        env = self.start("honest")
        self.assertExit(self.consolidate(env, self.p("out")), 0)
        self.ok("consolidate", self.p("root", BUCKET, "model.safetensors"), self.p("local"),
                "--no-progress")
        self.assertTrue(filecmp.cmp(self.p("out", "model.safetensors"),
                                    self.p("local", "model.safetensors"), shallow=False))

    def test_answer_naming_another_range_fails_with_data_loss(self):
        env = self.start("other-range")
        res = self.consolidate(env, self.p("out"))
        self.assertExit(res, 3)
        # The data starts at byte 176, after the 8-byte length and the header.
        self.assertEqual(self.error(self.p("out")), (
            "DATA_LOSS", "model.safetensors: tensor \"a.weight\": s3://models/model.safetensors: "
            "reading 1048576 bytes at byte offset 176: GET s3://models/model.safetensors "
            "bytes=176-1048751: server answered with another range (bytes 175-1048750/1573040) "
            "at offset 176"))
        self.assertNothingPublished(self.p("out"))

    def assertReplacedFails(self, mode, message):
        """Consolidates with the server in replacing `mode`: exit 3, nothing published, and
        FAILED_PRECONDITION `message` % (the object's ETag, the new version's)."""
        env = self.start(mode)
        res = self.consolidate(env, self.p("out"))
        self.assertExit(res, 3)
        with open(self.p("root", BUCKET, "model.safetensors"), "rb") as f:
            old = f.read()
        new = bytes((b + 1) % 256 for b in old)
        self.assertEqual(self.error(self.p("out")), (
            "FAILED_PRECONDITION",
            message % (hashlib.md5(old).hexdigest(), hashlib.md5(new).hexdigest())))
        self.assertNothingPublished(self.p("out"))

    def test_object_replaced_mid_job_fails_naming_both_etags(self):
        self.assertReplacedFails(
            "replaced", "model.safetensors: tensor \"a.weight\": s3://models/model.safetensors: "
            "reading 1048576 bytes at byte offset 176: s3://models/model.safetensors changed "
            "while being read: ETag \"%s\" at open, \"%s\" at offset 176 (GET "
            "s3://models/model.safetensors bytes=176-1048751)")

    def test_object_replaced_after_its_metadata_was_read_fails_naming_both_etags(self):
        # Replaced by an object of the same size between the header's read and the data's
        # open: the old header's offsets must not be read in the new bytes. The object's
        # HEADs: detection, the header reader's open, the conversion's open (the third).
        self.assertReplacedFails(
            "replaced-at-head-3", "s3://models/model.safetensors changed since its metadata "
            "was read: ETag \"%s\" then, \"%s\" now")


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl", "lying-s3"))
