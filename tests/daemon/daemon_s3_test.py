#!/usr/bin/python3
"""reshardd with s3:// roots, against a real Ceph radosgw started here (tests/s3/rgw_fixture.py).

The daemon runs with a local root and the s3 root s3://jobs/team-a, with the store's AWS
variables in its environment. Through reshardctl --server it must convert s3 -> local,
local -> s3 and s3 -> s3 (outputs compared element by element with the source by
tests/st_reference.py, and byte for byte with the same conversion run in-process), inspect an
s3:// input, refuse s3:// paths outside its roots (PERMISSION_DENIED, nothing written), and
count its S3 requests in reshard_s3_requests_total.

Run by hand (after bazel build //server:reshardd //client:reshardctl):
    /usr/bin/python3 tests/daemon/daemon_s3_test.py --reshardd bazel-bin/server/reshardd \
        --reshardctl bazel-bin/client/reshardctl --rgw-sh lib/io/s3/testing/rgw.sh \
        --flaky-proxy lib/io/s3/testing/flaky_proxy.py --rgw-fixture tests/s3/rgw_fixture.py
"""

import argparse
import filecmp
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_harness as H  # noqa: E402

BUCKET = "jobs"
ROOT = "s3://jobs/team-a"
RGW = None  # the rgw_fixture.Radosgw, started by main()


class S3DaemonTests(H.DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        # The daemon gets the store's AWS variables through os.environ (main() sets them).
        cls.DAEMON_ARGS = ("--allowed-root", ROOT)
        super().setUpClass()
        cls.s3 = RGW.boto3()
        cls.s3.create_bucket(Bucket=BUCKET)
        cls.src = os.path.join(cls.root, "src")
        H.make_checkpoint(cls.src, "24MiB", "8MiB")
        for name in sorted(os.listdir(cls.src)):
            cls.s3.upload_file(os.path.join(cls.src, name), BUCKET, "team-a/in/" + name)

    def download(self, prefix, folder):
        os.makedirs(folder)
        listed = self.s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])
        for item in listed:
            self.s3.download_file(BUCKET, item["Key"],
                                  os.path.join(folder, item["Key"][len(prefix) + 1:]))
        return sorted(os.listdir(folder))

    def in_process(self, src, name, *args):
        """The same consolidation run by reshardctl without the daemon, into root/NAME."""
        out = self.r(name)
        r = H.run_ctl(["consolidate", src, out] + list(args))
        self.assertOk(r)
        return out

    def assertSameDataFiles(self, a, b):
        names = sorted(n for n in os.listdir(a) if n != H.MANIFEST)
        self.assertEqual(names, sorted(n for n in os.listdir(b) if n != H.MANIFEST))
        for name in names:
            self.assertTrue(filecmp.cmp(os.path.join(a, name), os.path.join(b, name),
                                        shallow=False), name)

    def test_s3_input_local_output(self):
        out = self.r("from-s3")
        doc = self.assertOk(self.ctl("consolidate", ROOT + "/in", out, "--dtype", "bf16"))
        self.assertEqual(doc["state"], "succeeded", doc)
        self.assertConsolidated(self.src, out, "bf16")
        self.assertSameDataFiles(out, self.in_process(self.src, "ref-bf16", "--dtype", "bf16"))

    def test_local_input_s3_output(self):
        doc = self.assertOk(self.ctl("consolidate", self.src, ROOT + "/out-local-in",
                                     "--max-shard-size", "10MB"))
        self.assertEqual(doc["state"], "succeeded", doc)
        got = self.download("team-a/out-local-in", self.r("downloaded-1"))
        self.assertIn(H.MANIFEST, got)
        self.assertNotIn("reshard-in-progress.json", got)
        self.assertConsolidated(self.src, self.r("downloaded-1"))
        self.assertSameDataFiles(self.r("downloaded-1"),
                                 self.in_process(self.src, "ref-10mb", "--max-shard-size", "10MB"))

    def test_s3_to_s3(self):
        doc = self.assertOk(self.ctl("consolidate", ROOT + "/in", ROOT + "/out-s3-in"))
        self.assertEqual(doc["state"], "succeeded", doc)
        self.download("team-a/out-s3-in", self.r("downloaded-2"))
        self.assertConsolidated(self.src, self.r("downloaded-2"))
        # A second submission to the finished prefix is refused at submit (the daemon lists
        # the prefix as for a local folder), naming it; the output stays.
        self.assertError(self.ctl("consolidate", ROOT + "/in", ROOT + "/out-s3-in"), 3,
                         "FAILED_PRECONDITION", "s3://jobs/team-a/out-s3-in")
        # So is an input inside the output prefix (writing would delete it).
        self.assertError(self.ctl("consolidate", ROOT + "/in", ROOT, "--overwrite"), 3,
                         "PERMISSION_DENIED")
        self.assertError(self.ctl("consolidate", ROOT + "/out-s3-in/sub",
                                  ROOT + "/out-s3-in", "--overwrite"), 3, "INVALID_ARGUMENT",
                         "must not be, contain or lie inside the input")
        self.assertConsolidated(self.src, self.r("downloaded-2"))

    def test_inspect_and_plan_s3_input(self):
        doc = self.assertOk(self.ctl("inspect", ROOT + "/in"))
        self.assertIn("safetensors", str(doc))
        self.assertOk(self.ctl("plan", ROOT + "/in", "--dtype", "bf16"))

    def test_paths_outside_the_s3_root_are_refused(self):
        for src, out in ((ROOT + "/in", "s3://jobs/team-b/out"),
                         (ROOT + "/in", "s3://jobs/team-ab/out"),
                         ("s3://jobs/team-b/in", self.r("never")),
                         (ROOT + "/in", ROOT)):
            self.assertError(self.ctl("consolidate", src, out), 3, "PERMISSION_DENIED")
        self.assertError(self.ctl("inspect", "s3://other-bucket/in"), 3, "PERMISSION_DENIED")
        self.assertError(self.ctl("consolidate", ROOT + "/a/../in", self.r("never")), 3,
                         "INVALID_ARGUMENT")
        self.assertFalse(os.path.exists(self.r("never")))
        listed = self.s3.list_objects_v2(Bucket=BUCKET, Prefix="team-b/").get("KeyCount", 0)
        self.assertEqual(listed, 0)

    def test_daemon_killed_mid_upload_resumes_the_job(self):
        """reshardd killed while uploading (after one data object completed): restarted on the
        same state, it resumes the job, takes the prefix over, keeps the finished object and
        completes it."""
        state = os.path.join(self.tmp, "state-killed")
        args = ("--allowed-root", ROOT)
        killed = H.Daemon(self.logs, state, [self.root], args,
                          env={"RESHARD_TEST_FAULTS": "object-upload-started=kill"}).start()
        self.extra_daemons.append(killed)
        doc = self.assertOk(self.ctl("consolidate", self.src, ROOT + "/out-resumed",
                                     "--max-shard-size", "6MB", "--threads", "1", "--detach",
                                     daemon=killed))
        job_id = doc["job_id"]
        killed.wait(60)
        self.assertFalse(killed.alive(), "the fault point did not kill the daemon")
        listed = [o["Key"] for o in self.s3.list_objects_v2(
            Bucket=BUCKET, Prefix="team-a/out-resumed/").get("Contents", [])]
        self.assertNotIn("team-a/out-resumed/" + H.MANIFEST, listed)
        self.assertNotIn("team-a/out-resumed/" + H.INDEX, listed)
        self.assertTrue(self.s3.list_multipart_uploads(
            Bucket=BUCKET, Prefix="team-a/out-resumed/").get("Uploads"), "no upload in flight")
        finished = [k for k in listed if k.endswith(".safetensors")]
        self.assertTrue(finished, listed)

        restarted = H.Daemon(self.logs, state, [self.root], args).start()
        self.extra_daemons.append(restarted)
        done = self.wait_terminal(job_id, daemon=restarted)
        self.assertEqual(done["state"], "succeeded", done)
        # The objects finished before the kill were kept (their records held), not uploaded
        # again.
        self.assertEqual(done["reused_files"], len(finished), done)
        self.download("team-a/out-resumed", self.r("downloaded-resumed"))
        self.assertConsolidated(self.src, self.r("downloaded-resumed"))
        self.assertSameDataFiles(self.r("downloaded-resumed"),
                                 self.in_process(self.src, "ref-6mb", "--max-shard-size", "6MB"))
        self.assertFalse(self.s3.list_multipart_uploads(
            Bucket=BUCKET, Prefix="team-a/out-resumed/").get("Uploads"))

    def test_z_s3_requests_are_counted(self):
        self.assertOk(self.ctl("inspect", ROOT + "/in"))
        metrics = self.daemon.metrics()
        for name in ("reshard_s3_requests_total", "reshard_s3_retries_total"):
            self.assertIn((name, ()), metrics, "not exported")
        self.assertGreater(H.metric(metrics, "reshard_s3_requests_total"), 0)


def main():
    global RGW
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--rgw-sh", required=True)
    parser.add_argument("--flaky-proxy", required=True)
    parser.add_argument("--rgw-fixture", required=True)
    args, rest = parser.parse_known_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.rgw_fixture)))
    import rgw_fixture  # noqa: E402
    RGW = rgw_fixture.Radosgw(os.path.abspath(args.rgw_sh), os.path.abspath(args.flaky_proxy))
    RGW.start()
    try:
        os.environ.update({k: v for k, v in RGW.env().items() if k.startswith("AWS_")})
        sys.argv = [sys.argv[0]] + rest
        H.main()
    finally:
        RGW.stop()


if __name__ == "__main__":
    main()
