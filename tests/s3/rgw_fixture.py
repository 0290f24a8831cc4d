"""A real Ceph radosgw for the s3:// tests, and the flaky proxy in front of it.

    gw = rgw_fixture.Radosgw(rgw_sh, flaky_proxy_py, fail_every=4, drop_every=5)
    gw.start()              # about 15 s; raises naming tools/setup.sh when Ceph is missing
    env = gw.env()          # os.environ plus AWS_* for gw.endpoint (secret= for a wrong one)
    s3 = gw.boto3()         # a boto3 client of the same store
    gw.stop()               # Ceph's logs go to TEST_UNDECLARED_OUTPUTS_DIR

The cluster lives under a short /tmp/rgw.XXXXXX (Ceph's admin sockets: Unix path limit) with
ports chosen at run time (lib/io/s3/testing/rgw.sh). The proxy (testing/flaky_proxy.py)
answers every `fail_every`-th request 503 SlowDown and drops every `drop_every`-th connection.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

KEY, SECRET = "TESTKEY", "TESTSECRET"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Radosgw:
    def __init__(self, rgw_sh, flaky_proxy, fail_every=4, drop_every=5):
        self.rgw_sh, self.flaky_proxy = rgw_sh, flaky_proxy
        self.fail_every, self.drop_every = fail_every, drop_every
        self.base = None
        self.proxy = None
        self.endpoint = self.proxy_endpoint = self.proxy_stats = None

    def start(self):
        for tool in ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "monmaptool",
                     "uuidgen", "curl"):
            if shutil.which(tool) is None:
                raise RuntimeError("%s not found. Run tools/setup.sh (installs ceph-mon ceph-osd "
                                   "radosgw ceph-common uuid-runtime) to run the radosgw tests."
                                   % tool)
        self.base = tempfile.mkdtemp(prefix="rgw.", dir="/tmp")
        rgw_port, mon_port = free_port(), free_port()
        while mon_port == rgw_port:
            mon_port = free_port()
        start = time.time()
        subprocess.run([self.rgw_sh, "start", self.base, str(rgw_port), str(mon_port)],
                       check=True, stdout=subprocess.DEVNULL)
        sys.stderr.write("radosgw up on 127.0.0.1:%d after %.0f s\n"
                         % (rgw_port, time.time() - start))
        self.endpoint = "http://127.0.0.1:%d" % rgw_port
        port_file = os.path.join(self.base, "proxy.port")
        self.proxy_stats = os.path.join(self.base, "proxy.stats")
        self.proxy = subprocess.Popen(
            ["/usr/bin/python3", self.flaky_proxy, str(rgw_port), port_file, self.proxy_stats,
             str(self.fail_every), str(self.drop_every)])
        for _ in range(50):
            if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                break
            time.sleep(0.1)
        with open(port_file) as f:
            self.proxy_endpoint = "http://127.0.0.1:%d" % int(f.read())

    def stop(self):
        if self.proxy is not None:
            self.proxy.kill()
            self.proxy.wait()
            self.proxy = None
        if self.base is None:
            return
        subprocess.run([self.rgw_sh, "stop", self.base], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        logs = os.path.join(self.base, "log")
        outputs = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
        if outputs and os.path.isdir(logs):
            shutil.copytree(logs, os.path.join(outputs, "ceph-logs"), dirs_exist_ok=True)
        shutil.rmtree(self.base, ignore_errors=True)
        self.base = None

    def env(self, endpoint=None, secret=SECRET):
        """os.environ with the AWS variables of this store (and nothing of the machine's)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.pop("RESHARD_TEST_FAULTS", None)
        env.update({"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": secret,
                    "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint or self.endpoint,
                    # Not the machine user's ~/.aws files.
                    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                    "AWS_CONFIG_FILE": "/nonexistent"})
        return env

    def boto3(self):
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEY,
                            aws_secret_access_key=SECRET, region_name="us-east-1",
                            config=Config(s3={"addressing_style": "path"}))
