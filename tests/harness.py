"""Shared pieces of the Python end-to-end suites: a test case with its own temporary folder,
and a main() that takes the binaries under test as flags (`--reshardctl PATH`) before handing
the remaining arguments (test names) to unittest."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

# The binaries under test, name -> absolute path, filled by main().
BINARIES = {}


class TempDirTestCase(unittest.TestCase):
    """Each test gets a fresh folder, self.tmp; RESHARD_E2E_KEEP_TMP=1 keeps it for debugging."""

    maxDiff = 4000
    TMP_PREFIX = "reshard"

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="%s-%s-" % (self.TMP_PREFIX, self._testMethodName))

    def tearDown(self):
        if os.environ.get("RESHARD_E2E_KEEP_TMP"):
            sys.stderr.write("kept %s\n" % self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def p(self, *parts):
        return os.path.join(self.tmp, *parts)


class CliTestCase(TempDirTestCase):
    """Runs reshardctl (given to main() as --reshardctl) in a subprocess and checks how it
    exits. Every result carries cmd, stdout_text, stderr_text and text (both)."""

    TIMEOUT = 60

    def ctl(self, *args, timeout=None, cwd=None, max_memory=None):
        timeout = timeout or self.TIMEOUT
        cmd = [BINARIES["reshardctl"]] + [str(a) for a in args]

        def limit():
            if max_memory:
                import resource
                resource.setrlimit(resource.RLIMIT_AS, (max_memory, max_memory))
        try:
            res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 timeout=timeout, cwd=cwd, preexec_fn=limit)
        except subprocess.TimeoutExpired:
            self.fail("timed out after %ss (hang): %s" % (timeout, " ".join(cmd)))
        res.stdout_text = res.stdout.decode("utf-8", "replace")
        res.stderr_text = res.stderr.decode("utf-8", "replace")
        res.text = res.stdout_text + res.stderr_text
        res.cmd = cmd
        return res

    def describe(self, res):
        return "\ncommand: %s\nexit: %s\nstdout: %s\nstderr: %s" % (
            " ".join(res.cmd), res.returncode, res.stdout_text[-3000:], res.stderr_text[-3000:])

    def assertExit(self, res, code):
        self.assertGreaterEqual(res.returncode, 0, "killed by a signal (crash)" + self.describe(res))
        self.assertEqual(res.returncode, code, "unexpected exit code" + self.describe(res))

    def assertRefusedWithoutOutput(self, args, out, code, message):
        """reshardctl `args` exits `code`, its output holds `message`, and `out` (the output it
        was given) is not created."""
        res = self.ctl(*args)
        self.assertExit(res, code)
        self.assertIn(message, res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "%s created by a refused run" % out)
        return res

    def ok(self, *args, **kw):
        res = self.ctl(*args, **kw)
        self.assertExit(res, 0)
        return res

    def inspect_json(self, path, *args):
        """`reshardctl inspect PATH --json` (must succeed) as a dict."""
        doc = json.loads(self.ok("inspect", path, "--json", *args).stdout_text)
        self.assertTrue(doc["ok"])
        return doc


# Peak resident set size a conversion may reach, whatever the model's size (docs/benchmarks.md,
# "Peak RSS of every input format"); the bounded-memory tests convert inputs well above it.
MAX_CONVERSION_RSS = 200 << 20


def run_peak_rss(cmd, timeout):
    """Runs cmd under GNU time; returns (exit code, stdout, stderr, peak RSS in bytes of cmd).
    Not wait4's ru_maxrss of a child of this Python: a child's maxrss starts from the RSS of the
    process it was forked from, so it would count this test's own arrays."""
    with tempfile.NamedTemporaryFile(mode="r") as rss:
        try:
            res = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name] + cmd,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("timed out after %ss: %s" % (timeout, " ".join(cmd)))
        lines = rss.read().split()
        peak_kib = int(lines[-1]) if lines else -1
    return res.returncode, res.stdout, res.stderr, peak_kib * 1024


def assert_bounded_rss(test, cmd, input_bytes, timeout=300):
    """Runs cmd (a reshardctl conversion), which must succeed with a peak RSS under
    MAX_CONVERSION_RSS on an input larger than that bound."""
    test.assertGreater(input_bytes, MAX_CONVERSION_RSS + (64 << 20), "input too small to tell")
    code, out, err, rss = run_peak_rss([str(a) for a in cmd], timeout)
    test.assertEqual(code, 0, "%s\nstdout: %s\nstderr: %s" % (
        " ".join(map(str, cmd)), out[-2000:], err[-2000:]))
    test.assertLess(rss, MAX_CONVERSION_RSS, "peak RSS %.1f MiB converting %.0f MiB: %s" % (
        rss / 2**20, input_bytes / 2**20, " ".join(map(str, cmd))))
    sys.stderr.write("peak RSS %.1f MiB converting %.0f MiB\n" % (rss / 2**20, input_bytes / 2**20))
    return rss


def stored_entry(path, name):
    """(byte offset of the payload, size) of the stored zip entry `name` of the file at `path`
    (a torch.save file): the payload follows the local header and its own name and extra."""
    import struct
    import zipfile
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_length + extra_length, info.file_size


def largest_record(path):
    """The name of the largest storage record ("<top>/data/<key>") of torch.save file `path`."""
    import zipfile
    with zipfile.ZipFile(path) as z:
        return max((i for i in z.infolist() if "/data/" in i.filename),
                   key=lambda i: i.file_size).filename


def flip_byte(src, at, dst=None):
    """Writes `src` with the byte at offset `at` inverted to `dst` (default: `src` itself);
    returns the path written."""
    with open(src, "rb") as f:
        data = bytearray(f.read())
    data[at] ^= 0xFF
    dst = dst or src
    with open(dst, "wb") as f:
        f.write(bytes(data))
    return dst


def corrupt_largest_record(path):
    """Flips the middle byte of the largest storage record of torch.save file `path` in place,
    checks that Python's zipfile now reports that record's CRC-32 as bad, and returns its
    name."""
    import zipfile
    record = largest_record(path)
    offset, size = stored_entry(path, record)
    flip_byte(path, offset + size // 2)
    with zipfile.ZipFile(path) as z:
        bad = z.testzip()
    if bad != record:
        raise AssertionError("zipfile.testzip() gives %r after flipping a byte of %s" %
                             (bad, record))
    return record


def main(module_globals, *binaries):
    """Runs the module's tests. For each name in `binaries` ("reshardctl"), `--name PATH` or
    `--name=PATH` is required and stored, absolute, as module_globals[NAME.upper()]."""
    found = {}
    argv = [sys.argv[0]]
    args = sys.argv[1:]
    i = 0
    while i < len(args):
        arg = args[i]
        for name in binaries:
            if arg == "--" + name and i + 1 < len(args):
                found[name] = args[i + 1]
                i += 1
                break
            if arg.startswith("--%s=" % name):
                found[name] = arg.split("=", 1)[1]
                break
        else:
            argv.append(arg)
        i += 1
    for name in binaries:
        path = os.path.abspath(found.get(name, ""))
        if name not in found or not os.access(path, os.X_OK):
            sys.stderr.write("usage: %s %s [unittest args]\n(missing or not executable: --%s)\n"
                             % (sys.argv[0], " ".join("--%s PATH" % b for b in binaries), name))
            return 2
        module_globals[name.upper()] = path
        BINARIES[name] = path
    program = unittest.main(argv=argv, exit=False, verbosity=2)
    return 0 if program.result.wasSuccessful() else 1
