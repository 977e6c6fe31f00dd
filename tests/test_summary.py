"""The test summary names a missing bubblewrap and how many sandbox tests it skipped (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")


def test_skipped_sandbox_tests_are_counted_and_the_package_named(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makepyfile(test_sandbox='''
import pytest

@pytest.mark.skipif(True, reason="no bubblewrap sandbox on this machine: bwrap not found")
@pytest.mark.parametrize("n", range(3))
def test_escape(n):
    pass

@pytest.mark.skip(reason="no CUDA device here")
def test_gpu():
    pass
''')
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines(["*missing system package*", "3 sandbox tests skipped: bubblewrap (bwrap) does not run here*"])


def test_nothing_is_said_when_no_sandbox_test_was_skipped(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makepyfile(test_other="def test_ok():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "missing system package" not in result.stdout.str()
