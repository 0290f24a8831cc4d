"""reshardctl consolidations into s3:// prefixes, against a real radosgw.

The test starts a one-host Ceph with radosgw (lib/io/s3/testing/rgw.sh, ports chosen here, the
cluster under a short /tmp/rgw.XXXXXX) and the flaky proxy in front of it (answers every 4th
request 503 SlowDown, drops every 5th connection). Every s3:// output is downloaded with boto3
and compared byte for byte with the same consolidation into a local folder; manifests are
compared without their timestamps. Missing Ceph packages fail the test (tools/setup.sh
installs them). With a radosgw the caller started, S3_TEST_ENDPOINT, S3_TEST_PROXY_ENDPOINT,
S3_TEST_PROXY_STATS and S3_TEST_CEPH_CONF (its ceph.conf, for radosgw-admin) name it.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import boto3
import numpy as np
import botocore.config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rgw_fixture  # noqa: E402

ARGS = None
BUCKET = "reshard-out-%d" % os.getpid()  # fresh for every run
MANIFEST = "reshard-manifest.json"
MARKER = "reshard-in-progress.json"
INDEX = "model.safetensors.index.json"
RECORDS = ".reshard-progress"  # records of finished data objects while a run writes a prefix
# Several output files, the largest above one 8 MiB upload part (64 MiB of fp32 input).
SHARD = "20MB"


def s3_env(endpoint=None, secret="TESTSECRET"):
    env = dict(os.environ)
    env.update({
        "AWS_ACCESS_KEY_ID": "TESTKEY",
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint or os.environ["S3_TEST_ENDPOINT"],
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    })
    env.pop("AWS_SESSION_TOKEN", None)
    env.pop("RESHARD_TEST_FAULTS", None)
    return env


def reshardctl(*args, env=None, timeout=600):
    """Runs reshardctl with --json; returns (exit code, parsed stdout or None, stderr)."""
    proc = subprocess.run([ARGS.reshardctl, *args, "--json", "--no-progress"],
                          env=env if env is not None else s3_env(), capture_output=True,
                          text=True, timeout=timeout)
    doc = None
    if proc.stdout.strip():
        doc = json.loads(proc.stdout)
    return proc.returncode, doc, proc.stderr


def local_files(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


def comparable_manifest(data):
    manifest = json.loads(data)
    return {key: manifest[key] for key in ("tool", "request", "files", "tensors")}


class S3OutputTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.s3 = boto3.client(
            "s3", endpoint_url=os.environ["S3_TEST_ENDPOINT"], aws_access_key_id=rgw_fixture.KEY,
            aws_secret_access_key=rgw_fixture.SECRET, region_name="us-east-1",
            config=botocore.config.Config(s3={"addressing_style": "path"}))
        cls.s3.create_bucket(Bucket=BUCKET)
        cls.src = os.path.join(ARGS.work, "src")
        subprocess.run([sys.executable, ARGS.make_checkpoint, "--size", "64MiB",
                        "--max-shard-size", "24MiB", "--quiet", cls.src], check=True,
                       stdout=subprocess.DEVNULL)
        cls.refs = {}
        for dtype in ("keep", "bf16"):
            out = os.path.join(ARGS.work, "ref-" + dtype)
            code, _, err = reshardctl("consolidate", cls.src, out, "--dtype", dtype,
                                      "--max-shard-size", SHARD, env=dict(os.environ))
            assert code == 0, err
            cls.refs[dtype] = local_files(out)

    def keys(self, prefix, bucket=BUCKET):
        paginator = self.s3.get_paginator("list_objects_v2")
        keys = []
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix + "/"):
            keys += [o["Key"][len(prefix) + 1:] for o in page.get("Contents", [])]
        return sorted(keys)

    def objects(self, prefix):
        """Key (relative to `prefix`) -> the listing's entry (Size, ETag, LastModified)."""
        paginator = self.s3.get_paginator("list_objects_v2")
        objects = {}
        for page in paginator.paginate(Bucket=BUCKET, Prefix=prefix + "/"):
            for o in page.get("Contents", []):
                objects[o["Key"][len(prefix) + 1:]] = o
        return objects

    def uploads(self, prefix, bucket=BUCKET):
        answer = self.s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/")
        return answer.get("Uploads", [])

    def get(self, prefix, name, bucket=BUCKET):
        return self.s3.get_object(Bucket=bucket, Key=prefix + "/" + name)["Body"].read()

    def assertSameAsLocal(self, prefix, dtype_or_files, bucket=BUCKET):
        """The objects under `prefix` are the local output (self.refs[dtype], or files)."""
        ref = dtype_or_files
        if isinstance(ref, str):
            ref = self.refs[ref]
        self.assertEqual(self.keys(prefix, bucket), sorted(ref))
        for name, data in ref.items():
            got = self.get(prefix, name, bucket)
            if name == MANIFEST:
                self.assertEqual(comparable_manifest(got), comparable_manifest(data))
            else:
                self.assertEqual(len(got), len(data), name)
                self.assertTrue(got == data, "%s/%s differs from the local output" % (prefix, name))
        self.assertEqual(self.uploads(prefix, bucket), [])

    def test_consolidate_fp32_and_bf16(self):
        for dtype in ("keep", "bf16"):
            with self.subTest(dtype=dtype):
                prefix = "model-" + dtype
                result_file = os.path.join(ARGS.work, "result-%s.json" % dtype)
                code, doc, err = reshardctl("consolidate", self.src, "s3://%s/%s" % (BUCKET, prefix),
                                            "--dtype", dtype, "--max-shard-size", SHARD,
                                            "--result-file", result_file)
                self.assertEqual(code, 0, err)
                self.assertEqual(doc["output"], "s3://%s/%s" % (BUCKET, prefix))
                with open(result_file) as f:
                    self.assertEqual(json.load(f)["output"], doc["output"])
                data_files = [n for n in self.refs[dtype] if n.endswith(".safetensors")]
                self.assertGreater(len(data_files), 1)
                self.assertGreater(max(len(self.refs[dtype][n]) for n in data_files), 8 << 20)
                self.assertEqual(sorted(f["name"] for f in doc["files"]),
                                 sorted(n for n in self.refs[dtype] if n != MANIFEST))
                self.assertSameAsLocal(prefix, dtype)
        # The independent safetensors reader loads the downloaded output as the source's
        # tensors, bit for bit.
        import st_reference
        folder = os.path.join(ARGS.work, "downloaded")
        os.makedirs(folder)
        for name in self.keys("model-keep"):
            with open(os.path.join(folder, name), "wb") as f:
                f.write(self.get("model-keep", name))
        got = st_reference.read_folder(folder)
        want = st_reference.read_folder(self.src)
        self.assertEqual(sorted(got), sorted(want))
        for name, tensor in want.items():
            self.assertEqual(got[name].raw(), tensor.raw(), name)

    def test_peak_rss_leaves_the_cap_a_margin(self):
        # The window and the uploads' parts share what kOutputMemoryCap (64 MiB) leaves once the
        # process's own memory (kProcessMemory) is set aside: the whole process peaks below
        # 60 MiB (GNU time's maximum resident set, of reshardctl alone).
        with tempfile.NamedTemporaryFile(mode="r") as rss:
            proc = subprocess.run(
                ["/usr/bin/time", "-f", "%M", "-o", rss.name, ARGS.reshardctl, "consolidate",
                 self.src, "s3://%s/rss" % BUCKET, "--max-shard-size", SHARD, "--no-progress"],
                env=s3_env(), capture_output=True, text=True, timeout=600)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            peak = int(rss.read().split()[-1]) * 1024
        sys.stderr.write("consolidate into s3://: peak RSS %.1f MiB\n" % (peak / 2**20))
        self.assertLess(peak, 60 << 20, "peak RSS %.1f MiB" % (peak / 2**20))

    def test_non_empty_prefix_is_refused_and_overwrite_replaces_it(self):
        prefix = "busy"
        self.s3.put_object(Bucket=BUCKET, Key=prefix + "/notes.txt", Body=b"keep me")
        code, doc, err = reshardctl("consolidate", self.src, "s3://%s/%s" % (BUCKET, prefix),
                                    "--max-shard-size", SHARD)
        self.assertEqual(code, 3, err)
        self.assertEqual(doc["error"]["code"], "FAILED_PRECONDITION")
        self.assertIn("not empty", doc["error"]["message"])
        self.assertIn("s3://%s/%s/notes.txt" % (BUCKET, prefix), doc["error"]["message"])
        self.assertEqual(self.keys(prefix), ["notes.txt"])
        self.assertEqual(self.uploads(prefix), [])
        # A prefix "busy2" is not inside "busy".
        self.s3.put_object(Bucket=BUCKET, Key="busy2/other", Body=b"x")

        # --overwrite: the fp32 output replaces the notes, then a bf16 output (fewer files)
        # replaces the fp32 one without leaving any of its files behind.
        for dtype in ("keep", "bf16"):
            code, _, err = reshardctl("consolidate", self.src, "s3://%s/%s" % (BUCKET, prefix),
                                      "--dtype", dtype, "--max-shard-size", SHARD, "--overwrite")
            self.assertEqual(code, 0, err)
            self.assertSameAsLocal(prefix, dtype)
        # A finished output is refused without --overwrite, and stays as it was.
        code, doc, err = reshardctl("consolidate", self.src, "s3://%s/%s" % (BUCKET, prefix),
                                    "--max-shard-size", SHARD)
        self.assertEqual(code, 3, err)
        self.assertIn("finished output", doc["error"]["message"])
        self.assertSameAsLocal(prefix, "bf16")
        self.assertEqual(self.s3.get_object(Bucket=BUCKET, Key="busy2/other")["Body"].read(), b"x")

    def test_errors_name_the_s3_error(self):
        code, doc, err = reshardctl("consolidate", self.src, "s3://%s/denied" % BUCKET,
                                    env=s3_env(secret="WRONGSECRET"))
        self.assertNotEqual(code, 0)
        self.assertIn("SignatureDoesNotMatch", doc["error"]["message"])
        self.assertIn("s3://%s/denied" % BUCKET, doc["error"]["message"])
        code, doc, err = reshardctl("consolidate", self.src, "s3://no-such-bucket-here/out")
        self.assertNotEqual(code, 0)
        self.assertEqual(doc["error"]["code"], "NOT_FOUND")
        self.assertIn("NoSuchBucket", doc["error"]["message"])
        self.assertIn("no-such-bucket-here", doc["error"]["message"])
        # An input inside the output prefix would be deleted by writing it (s3:// inputs are
        # refused as such for now, but never this way).
        code, doc, err = reshardctl("consolidate", "s3://%s/same/model" % BUCKET,
                                    "s3://%s/same" % BUCKET, "--overwrite")
        self.assertEqual(code, 3, err)
        self.assertIn("contains the input", doc["error"]["message"])
        # A partitioned conversion needs a place beside the output for its shared area.
        code, doc, err = reshardctl("consolidate", self.src, "s3://%s" % BUCKET,
                                    "--partition", "0/2")
        self.assertEqual(code, 3, err)
        self.assertEqual(doc["error"]["code"], "INVALID_ARGUMENT")
        self.assertIn("output s3://%s does not end in a folder name" % BUCKET,
                      doc["error"]["message"])
        self.assertEqual(self.keys("denied"), [])

    def test_kill_mid_upload_then_rerun(self):
        prefix = "killed"
        url = "s3://%s/%s" % (BUCKET, prefix)
        env = s3_env()
        # Killed when the second data object's upload has started: the first is complete.
        env["RESHARD_TEST_FAULTS"] = "object-upload-started=kill"
        code, _, err = reshardctl("consolidate", self.src, url, "--max-shard-size", SHARD,
                                  "--threads", "1", env=env)
        self.assertEqual(code, -9, err)
        keys = self.keys(prefix)
        self.assertNotIn(MANIFEST, keys)
        self.assertNotIn(INDEX, keys)
        self.assertIn(MARKER, keys)
        finished = [k for k in keys if k.endswith(".safetensors")]
        self.assertTrue(finished, keys)
        self.assertNotEqual(self.uploads(prefix), [])
        # Every finished data object has its record, written after the object completed.
        self.assertEqual(sorted(k for k in keys if k.startswith(RECORDS + "/")),
                         sorted("%s/%s.json" % (RECORDS, k) for k in finished))
        before = self.objects(prefix)
        time.sleep(1.1)  # LastModified has whole seconds: an object uploaded again would differ

        # The rerun takes the unfinished prefix over (no --overwrite needed), aborts the stale
        # upload, keeps the objects finished before the kill and writes the others.
        code, doc, err = reshardctl("consolidate", self.src, url, "--max-shard-size", SHARD,
                                    "--threads", "1")
        self.assertEqual(code, 0, err)
        self.assertEqual(doc["reused_files"], len(finished), doc)
        self.assertEqual(doc["reused_bytes"], sum(before[k]["Size"] for k in finished), doc)
        self.assertEqual(doc["verification_failures"], 0, doc)
        after = self.objects(prefix)
        for key in finished:
            # Not uploaded again: the same object (ETag) from the same time.
            self.assertEqual(after[key]["LastModified"], before[key]["LastModified"], key)
            self.assertEqual(after[key]["ETag"], before[key]["ETag"], key)
        self.assertEqual(len(doc["files"]), len(self.refs["keep"]) - 1)  # no manifest there
        # Byte-equal to the local output, manifest included; no record and no marker left.
        self.assertSameAsLocal(prefix, "keep")

    def test_cancelled_run_aborts_its_uploads(self):
        prefix = "cancelled"
        url = "s3://%s/%s" % (BUCKET, prefix)
        env = s3_env()
        # Held once the second data object's upload has started, until SIGINT cancels the run.
        env["RESHARD_TEST_FAULTS"] = "object-upload-started=wait:%s" % os.path.join(
            ARGS.work, "never-created")
        proc = subprocess.Popen([ARGS.reshardctl, "consolidate", self.src, url, "--max-shard-size",
                                 SHARD, "--threads", "1", "--no-progress"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while not self.uploads(prefix) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        self.assertNotEqual(self.uploads(prefix), [])
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 5, err)
        self.assertIn("cancelled", err)
        self.assertEqual(self.uploads(prefix), [])
        keys = self.keys(prefix)
        self.assertNotIn(MANIFEST, keys)
        self.assertNotIn(INDEX, keys)

    def test_reshard_to_s3(self):
        rules = os.path.join(ARGS.work, "rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [
                {"pattern": "(q|k|v|gate|up)_proj\\.weight$", "split_dim": 0},
                {"pattern": "(o|down)_proj\\.weight$", "split_dim": 1},
                {"pattern": ".*", "replicate": True}]}, f)
        local = os.path.join(ARGS.work, "parts-local")
        code, _, err = reshardctl("reshard", self.src, local, "--parts", "2", "--rules", rules,
                                  env=dict(os.environ))
        self.assertEqual(code, 0, err)
        code, doc, err = reshardctl("reshard", self.src, "s3://%s/parts" % BUCKET, "--parts", "2",
                                    "--rules", rules)
        self.assertEqual(code, 0, err)
        self.assertEqual(doc["output"], "s3://%s/parts" % BUCKET)
        self.assertSameAsLocal("parts", local_files(local))

    def test_bucket_quota_fails_the_run_and_a_rerun_after_lifting_it_completes(self):
        # A bucket quota of 30 MB, below the 64 MiB output: radosgw refuses an upload part
        # midway (403 QuotaExceeded). The run fails RESOURCE_EXHAUSTED (exit 6) at once, naming
        # the object and the quota; nothing is published and the marker stays, so that the
        # rerun, once the quota is lifted, takes the output over and completes it.
        bucket = "reshard-quota-%d" % os.getpid()
        prefix = "model"
        url = "s3://%s/%s" % (bucket, prefix)
        self.s3.create_bucket(Bucket=bucket)
        admin = ["radosgw-admin", "-c", os.environ["S3_TEST_CEPH_CONF"]]
        subprocess.run(admin + ["quota", "set", "--quota-scope=bucket", "--bucket", bucket,
                                "--max-size=30000000"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(admin + ["quota", "enable", "--quota-scope=bucket", "--bucket", bucket],
                       check=True, stdout=subprocess.DEVNULL)
        start = time.time()
        code, doc, err = reshardctl("consolidate", self.src, url, "--max-shard-size", SHARD,
                                    "--threads", "1", timeout=240)
        took = time.time() - start
        sys.stderr.write("consolidate into a bucket over its quota: exit %d after %.1f s\n"
                         % (code, took))
        self.assertEqual(code, 6, err)
        self.assertEqual(doc["error"]["code"], "RESOURCE_EXHAUSTED")
        message = doc["error"]["message"]
        self.assertRegex(message, r"UploadPart %s/model-0000[0-9]-of-0000[0-9]\.safetensors "
                         r"part [0-9]+: S3 QuotaExceeded \(HTTP 403\)" % url)
        self.assertLess(took, 60)
        keys = self.keys(prefix, bucket)
        self.assertNotIn(MANIFEST, keys)
        self.assertNotIn(INDEX, keys)
        self.assertIn(MARKER, keys)
        self.assertEqual(self.uploads(prefix, bucket), [])

        subprocess.run(admin + ["quota", "disable", "--quota-scope=bucket", "--bucket", bucket],
                       check=True, stdout=subprocess.DEVNULL)
        code, doc, err = reshardctl("consolidate", self.src, url, "--max-shard-size", SHARD)
        self.assertEqual(code, 0, err)
        self.assertSameAsLocal(prefix, "keep", bucket)

    def test_through_a_flaky_proxy(self):
        prefix = "flaky"
        before = {"failed_503": 0, "dropped": 0}
        if os.path.exists(os.environ["S3_TEST_PROXY_STATS"]):
            with open(os.environ["S3_TEST_PROXY_STATS"]) as f:
                before = json.load(f)
        code, _, err = reshardctl("consolidate", self.src, "s3://%s/%s" % (BUCKET, prefix),
                                  "--max-shard-size", SHARD,
                                  env=s3_env(endpoint=os.environ["S3_TEST_PROXY_ENDPOINT"]))
        self.assertEqual(code, 0, err)
        with open(os.environ["S3_TEST_PROXY_STATS"]) as f:
            after = json.load(f)
        self.assertGreater(after["failed_503"], before["failed_503"])
        self.assertGreater(after["dropped"], before["dropped"])
        self.assertSameAsLocal(prefix, "keep")


    def test_partitioned_workers_then_a_killed_one_rerun(self):
        """Three workers (--partition I/3) as separate processes write one s3:// output. The
        worker with two files is killed while its second upload runs, the others finish (not
        publishing: its record is missing), and its rerun keeps the finished object, writes the
        other, and publishes. The output is the unpartitioned local one, byte for byte and
        element by element read with the reference reader."""
        prefix = "partitioned"
        url = "s3://%s/%s" % (BUCKET, prefix)
        area = ".%s.reshard-partitions" % prefix
        proc = subprocess.run([ARGS.reshardctl, "plan", self.src, "--partitions", "3",
                               "--max-shard-size", SHARD, "--json"], capture_output=True,
                              text=True, timeout=600, check=True)
        plan = json.loads(proc.stdout)
        killed = [p for p in plan["partitions"] if len(p["files"]) >= 2][0]
        index = killed["partition"]

        def worker(i, env=None):
            return reshardctl("consolidate", self.src, url, "--max-shard-size", SHARD,
                              "--threads", "1", "--partition", "%d/3" % i, env=env)

        env = s3_env()
        env["RESHARD_TEST_FAULTS"] = "object-upload-started=kill"
        code, _, err = worker(index, env)
        self.assertEqual(code, -9, err)
        keys = self.keys(prefix)
        self.assertIn(MARKER, keys)
        self.assertNotIn(MANIFEST, keys)
        finished = [k for k in keys if k.endswith(".safetensors")]
        self.assertEqual(finished, killed["files"][:1])
        self.assertEqual(sorted(k for k in keys if k.startswith(RECORDS + "/")),
                         ["%s/%s.json" % (RECORDS, finished[0])])
        self.assertNotEqual(self.uploads(prefix), [], "the second upload was under way")
        self.assertIn("partition-%05d-of-00003.claim" % index, self.keys(area))

        for i in range(3):
            if i == index:
                continue
            code, doc, err = worker(i)
            self.assertEqual(code, 0, err)
            self.assertFalse(doc["published"], doc)
        self.assertNotIn(MANIFEST, self.keys(prefix))
        before = self.objects(prefix)
        time.sleep(1.1)  # LastModified has whole seconds: an object uploaded again would differ

        # The killed worker's claim is taken over (its process is gone), its unfinished upload
        # aborted, its finished object kept.
        code, doc, err = worker(index)
        self.assertEqual(code, 0, err)
        self.assertTrue(doc["published"], doc)
        self.assertEqual(doc["reused_files"], 1, doc)
        self.assertEqual(doc["verification_failures"], 0, doc)
        after = self.objects(prefix)
        self.assertEqual(after[finished[0]]["LastModified"], before[finished[0]]["LastModified"])
        self.assertSameAsLocal(prefix, "keep")
        self.assertEqual(self.keys(area), [], "the shared area is removed")
        self.assertEqual(self.uploads(area), [])

        # Element by element, read with the reference reader, against the input.
        import st_reference  # noqa: E402  (ARGS.st_reference's folder is on sys.path)
        local = os.path.join(ARGS.work, "partitioned-download")
        os.makedirs(local)
        for name in self.keys(prefix):
            with open(os.path.join(local, name), "wb") as f:
                f.write(self.get(prefix, name))
        got = st_reference.read_folder(local)
        want = st_reference.read_folder(self.src)
        self.assertEqual(sorted(got), sorted(want))
        for name, tensor in want.items():
            self.assertEqual(got[name].dtype, tensor.dtype, name)
            self.assertTrue(np.array_equal(got[name].array, tensor.array), name)

        # A worker rerun after publishing finds its split's output.
        code, doc, err = worker(0)
        self.assertEqual(code, 0, err)
        self.assertTrue(doc["found_published"], doc)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--reshardctl", required=True)
    parser.add_argument("--make-checkpoint", required=True)
    parser.add_argument("--rgw-sh", required=True)
    parser.add_argument("--flaky-proxy", required=True)
    parser.add_argument("--st-reference", required=True)
    parser.add_argument("--work", help="scratch folder (default: a new one, removed after)")
    ARGS, rest = parser.parse_known_args()
    for name in ("reshardctl", "make_checkpoint", "rgw_sh", "flaky_proxy", "st_reference"):
        setattr(ARGS, name, os.path.abspath(getattr(ARGS, name)))
    sys.path.insert(0, os.path.dirname(ARGS.st_reference))
    work = ARGS.work
    if work is None:
        ARGS.work = tempfile.mkdtemp(prefix="s3_output.", dir=os.environ.get("TEST_TMPDIR"))
    rgw = None
    if "S3_TEST_ENDPOINT" not in os.environ:  # else: a radosgw the caller started
        rgw = rgw_fixture.Radosgw(ARGS.rgw_sh, ARGS.flaky_proxy, fail_every=4, drop_every=5)
        rgw.start()
        os.environ["S3_TEST_ENDPOINT"] = rgw.endpoint
        os.environ["S3_TEST_PROXY_ENDPOINT"] = rgw.proxy_endpoint
        os.environ["S3_TEST_PROXY_STATS"] = rgw.proxy_stats
        os.environ["S3_TEST_CEPH_CONF"] = os.path.join(rgw.base, "ceph.conf")
    try:
        program = unittest.main(argv=[sys.argv[0]] + rest, verbosity=2, exit=False)
    finally:
        if rgw is not None:
            rgw.stop()
        if work is None:
            shutil.rmtree(ARGS.work, ignore_errors=True)
    sys.exit(0 if program.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
