"""`make test`'s line per tier (tests/conftest.py's pytest_terminal_summary): the tier named by
its marker expression, the counts, the time and the workers, printed last and appended to the
file $WELLFED_TIERS names."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import PROJECT, TIERS

TESTS = '''import pytest

def test_one(): pass

def test_two(): pass

@pytest.mark.slow
def test_slow(): pass

def test_skipped(): pytest.skip("not here")

def test_failing(): assert {fail}
'''


def run_tier(folder, expr: str, fail: bool):
    """pytest on a folder of five tests (one slow) whose conftest is the suite's hook."""
    (folder / "conftest.py").write_text("from tests.conftest import pytest_terminal_summary\n")
    (folder / "test_five.py").write_text(TESTS.format(fail=not fail))
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n    e2e: e2e\n"
                                      "    integration: integration\n")
    env = {**os.environ, "WELLFED_TIERS": str(folder / "out" / "tiers.txt"),
           "PYTHONPATH": os.pathsep.join([str(PROJECT), str(PROJECT / "src")]),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # no xdist, hydra, ...: a second, not ten
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-m", expr, str(folder)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_fast_tier_says_its_counts_time_and_workers_last_and_in_the_file(tmp_path):
    fast = next(expr for expr, name in TIERS.items() if name == "fast")
    proc = run_tier(tmp_path, fast, fail=False)
    assert proc.returncode == 0, proc.stdout[-2000:]
    line = re.compile(r"tier fast: 3 passed, 1 skipped in \d+ min \d+ s \(1 worker, exit 0\)")
    lines = proc.stdout.strip().splitlines()
    assert line.fullmatch(lines[-2]), lines[-3:]  # then only pytest's own "=== ... ===" line
    saved = (tmp_path / "out" / "tiers.txt").read_text().splitlines()
    assert len(saved) == 1 and line.fullmatch(saved[0]), saved


def test_another_tier_names_its_expression_and_a_failure_its_exit(tmp_path):
    proc = run_tier(tmp_path, "slow or not slow", fail=True)
    assert proc.returncode == 1
    assert re.search(r"^tier -m 'slow or not slow': 3 passed, 1 failed, 1 skipped in \d+ min "
                     r"\d+ s \(1 worker, exit 1\)$", proc.stdout, re.M), proc.stdout[-2000:]
