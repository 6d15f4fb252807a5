"""Runs one copy of SGLang's radix-cache unit tests (unittest) and writes each test's
outcome to a JSON file: {"Class.test": [outcome, why]} with outcome "passed", "failed", "error" or "skipped" and
why the first line of the first failure; a test
with a failing subtest counts as failed. Used by scripts/sglang-check.

    python scripts/sglang_check_suite.py TEST_FILE OUT_JSON
"""

import importlib.util
import json
import sys
import unittest


class Recorder(unittest.TextTestResult):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.outcome = {}
        self.why = {}

    def _name(self, test):
        return f"{type(test).__name__}.{test._testMethodName}"

    def _set(self, test, what):
        name = self._name(test)
        order = ["passed", "skipped", "failed", "error"]
        if order.index(what) >= order.index(self.outcome.get(name, "passed")):
            self.outcome[name] = what

    def addSuccess(self, test):
        super().addSuccess(test)
        self._set(test, "passed")

    def _why(self, test, err):
        self.why.setdefault(self._name(test), f"{err[0].__name__}: {str(err[1]).splitlines()[0] if str(err[1]) else ''}"[:110])

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._set(test, "failed")
        self._why(test, err)

    def addError(self, test, err):
        super().addError(test, err)
        self._set(test, "error")
        self._why(test, err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._set(test, "skipped")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            failure = issubclass(err[0], test.failureException)
            self._set(test, "failed" if failure else "error")
            self._why(test, err)


def main():
    path, out = sys.argv[1], sys.argv[2]
    spec = importlib.util.spec_from_file_location("sglang_radix_cache_unit", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    suite = unittest.defaultTestLoader.loadTestsFromModule(mod)
    names = [f"{type(t).__name__}.{t._testMethodName}" for t in _flatten(suite)]
    runner = unittest.TextTestRunner(resultclass=Recorder, verbosity=0, stream=sys.stderr)
    result = runner.run(suite)
    outcome = {n: [result.outcome.get(n, "passed"), result.why.get(n, "")] for n in names}
    with open(out, "w") as f:
        json.dump(outcome, f, indent=1, sort_keys=True)


def _flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _flatten(t)
        else:
            yield t


if __name__ == "__main__":
    main()
