"""Macros of the format packages (lib/formats/<format>/BUILD.bazel).

A format package holds one or more registering libraries (a reader or a writer that registers
itself with lib/formats/format.h's registry from a static object, hence alwayslink), the
libraries they are built from, tests and libFuzzer targets beside the code they exercise, and
the conformance fixture of each input format (lib/formats/format_fixture.h).

  reshard_format(name, srcs, hdrs, deps, tests, fuzzers, fixture)
      The registering library `name`, its tests and fuzzers, and its fixture `<name>_fixture`.
  format_library(name, srcs, hdrs, deps, tests, fuzzers)
      A library that registers nothing, with its tests and fuzzers.
  format_test(name, srcs, deps, size), format_fuzzer(name, srcs, deps), format_fixture(srcs,
  hdrs, deps)
      The tests, fuzzers and fixture given to the two macros above.

Every deps list passes through in its order; each macro appends its standard deps that the list
does not already name:
  - a registering library: the registry, the status helpers, absl status and strings;
  - a test: the library it sits beside, gtest_main (size "small" unless given);
  - a fuzzer: the library it sits beside, absl strings (reshard_fuzzer: libFuzzer with
    --config=fuzz, a replay main otherwise; tests/fuzz/run_fuzzers.sh lists every fuzzer);
  - a fixture (testonly, alwayslink: linking it registers the fixture with the conformance
    suite): the fixture registry, lib/testing:test_files, absl strings.
"""

load("//tests/fuzz:fuzz.bzl", "reshard_fuzzer")

_FORMAT_DEPS = [
    "//lib/formats:format",
    "//lib/core:status",
    "@system//:absl_status",
    "@system//:absl_strings",
]

_TEST_DEPS = ["@system//:gtest_main"]

_FUZZER_DEPS = ["@system//:absl_strings"]

_FIXTURE_DEPS = [
    "//lib/formats:format_fixture",
    "//lib/testing:test_files",
    "@system//:absl_strings",
]

def format_test(name, srcs, deps = [], size = "small", **kwargs):
    """A cc_test beside a library of format_library or reshard_format (its `tests`)."""
    return dict(name = name, srcs = srcs, deps = deps, size = size, **kwargs)

def format_fuzzer(name, srcs, deps = []):
    """A libFuzzer target beside a library of format_library or reshard_format (`fuzzers`)."""
    return dict(name = name, srcs = srcs, deps = deps)

def format_fixture(srcs, hdrs = [], deps = []):
    """The conformance fixture of a reshard_format (its `fixture`)."""
    return dict(srcs = srcs, hdrs = hdrs, deps = deps)

def _with_standard(deps, standard):
    """`deps` in its order, then each of `standard` that `deps` does not name yet."""
    return deps + [dep for dep in standard if dep not in deps]

def format_library(name, srcs, hdrs = [], deps = [], tests = [], fuzzers = [], **kwargs):
    """A cc_library of a format package, with the tests and fuzzers beside it."""
    native.cc_library(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        **kwargs
    )
    for test in tests:
        attrs = dict(test)
        attrs["deps"] = _with_standard(test["deps"], [":" + name] + _TEST_DEPS)
        native.cc_test(**attrs)
    for fuzzer in fuzzers:
        reshard_fuzzer(
            name = fuzzer["name"],
            srcs = fuzzer["srcs"],
            deps = _with_standard(fuzzer["deps"], [":" + name] + _FUZZER_DEPS),
        )

def reshard_format(name, srcs, hdrs = [], deps = [], tests = [], fuzzers = [], fixture = None):
    """A registering library (alwayslink), its tests and fuzzers, and its fixture <name>_fixture."""
    format_library(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        deps = _with_standard(deps, _FORMAT_DEPS),
        tests = tests,
        fuzzers = fuzzers,
        alwayslink = True,
    )
    if fixture:
        native.cc_library(
            name = name + "_fixture",
            testonly = True,
            srcs = fixture["srcs"],
            hdrs = fixture["hdrs"],
            deps = _with_standard(fixture["deps"], _FIXTURE_DEPS),
            alwayslink = True,
        )
