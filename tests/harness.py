"""Shared pieces of the Python end-to-end suites: a test case with its own temporary folder,
and a main() that takes the binaries under test as flags (`--reshardctl PATH`) before handing
the remaining arguments (test names) to unittest."""

import os
import shutil
import sys
import tempfile
import unittest


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
    program = unittest.main(argv=argv, exit=False, verbosity=2)
    return 0 if program.result.wasSuccessful() else 1
