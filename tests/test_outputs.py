"""Atomic outputs: what a killed stage leaves beside an output is removed by the next write of it,
and only that (a process still writing keeps its copy)."""

import subprocess
import sys
import textwrap

from tests.conftest import PROJECT, write_tsv
from wellfed.outputs import atomic_path, remove_leftovers

# A process that starts writing `final` as a folder and is then killed (SIGKILL: no cleanup runs),
# or that stays inside atomic_path until its stdin closes.
WRITER = textwrap.dedent("""
    import os, signal, sys
    from wellfed.outputs import atomic_path
    with atomic_path(sys.argv[1], is_dir=True) as tmp:
        (tmp / "part.arrow").write_bytes(b"x" * 4096)
        print(tmp, flush=True)
        if sys.argv[2] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.stdin.read()
""")


def start_writer(final, how: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(final), how], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=600)
    return proc.pid  # exited and reaped: no process has this id for a while


def killed_writer(final):
    proc = start_writer(final, "kill")
    left = proc.stdout.readline().strip()
    assert proc.wait(timeout=600) == -9
    return left


def test_a_killed_writers_copy_is_removed_and_a_running_ones_kept(tmp_path):
    final = tmp_path / "tokens"
    live = start_writer(final, "wait")
    try:
        running = live.stdout.readline().strip()
        dead = killed_writer(final)  # its own start leaves the live writer's copy alone
        (tmp_path / ".tokens.tmp-0a1b2c3d").mkdir()  # wellfed before the pid was in the name
        (tmp_path / f".tokens.old-{dead_pid()}-0a1b2c3d").mkdir()
        kept = {".tokens.tmp-notours", ".tokensX.tmp-0a1b2c3d", ".other.tmp-1-0a1b2c3d"}
        for name in kept:
            (tmp_path / name).mkdir()
        assert {p.name for p in tmp_path.iterdir()} >= {dead.rsplit("/", 1)[1],
                                                        running.rsplit("/", 1)[1]}
        removed = remove_leftovers(final)
        assert len(removed) == 3 and removed[0].endswith("(0.0 MB)")
        left = {p.name for p in tmp_path.iterdir()}
        assert left == kept | {running.rsplit("/", 1)[1]}  # the live writer's copy survives
    finally:
        live.stdin.close()
        assert live.wait(timeout=600) == 0
    assert (final / "part.arrow").stat().st_size == 4096


def test_the_next_write_removes_the_leftover_and_says_so(tmp_path, capsys):
    final = tmp_path / "metrics.json"
    with atomic_path(final) as tmp:
        tmp.write_text("{}")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os, signal, sys
        from wellfed.outputs import atomic_path
        with atomic_path(sys.argv[1]) as tmp:
            tmp.write_text("half")
            os.kill(os.getpid(), signal.SIGKILL)
    """), str(final)], timeout=600)
    assert proc.returncode == -9
    assert len(list(tmp_path.glob(".metrics.json.tmp-*"))) == 1
    with atomic_path(final) as tmp:
        tmp.write_text('{"a": 1}')
    assert "removed what an interrupted run left" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_the_prepare_stage_removes_a_killed_runs_staging_folder(tmp_path):
    # The stage as dvc runs it: a killed earlier run left .prepared.tmp-<pid>-<hex>/ behind.
    left = killed_writer(tmp_path / "prepared")
    write_tsv(tmp_path / "raw" / "train.tsv", [(f"text {i}", "ab"[i % 2]) for i in range(40)])
    (tmp_path / "params.yaml").write_text("prepare: {validation: '', test: ''}\n")
    proc = subprocess.run([sys.executable, str(PROJECT / "stages" / "prepare.py"), "raw",
                           "prepared", "reports/prepare.json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    name = left.rsplit("/", 1)[1]
    assert f"removed what an interrupted run left: {name} (0.0 MB)" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", "prepared", "raw",
                                                          "reports"]


def test_a_folder_that_cannot_be_written_is_one_line_naming_it_and_nothing_stays(tmp_path,
                                                                                   monkeypatch):
    import errno
    from pathlib import Path

    import pytest

    from wellfed.cli import message
    from wellfed.outputs import WriteFault

    def refused(self, *args, **kwargs):  # what a read-only mount answers (errno 30)
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", refused)
    with pytest.raises(WriteFault) as err:
        with atomic_path(tmp_path / "model", is_dir=True):
            pass
    line = (f"cannot write {tmp_path}: it is on a read-only file system ([Errno 30] Read-only "
            "file system); make it writable, then rerun `dvc repro`")
    assert str(err.value) == line and message(err.value) == line
    monkeypatch.undo()

    def full(data):  # a disk filling up mid-write: the half-written copy goes
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(WriteFault, match=r"^cannot write .*: it is full \(\[Errno 28\] No space "
                                         r"left on device\); free some space"):
        with atomic_path(tmp_path / "metrics.json") as tmp:
            tmp.write_text("{")
            full(b"")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_check_room_judges_a_folder_not_made_yet_by_the_one_above_and_sums_a_filesystem(
        tmp_path, monkeypatch):
    """outputs.check_room, a stage's preflight: a folder that does not exist yet is judged by the
    nearest existing one (the write would make it there), and folders on one filesystem share
    its free bytes; nothing is left behind by the probe."""
    import errno
    import shutil
    import tempfile
    from pathlib import Path

    import pytest

    from wellfed.outputs import WriteFault, check_room

    (tmp_path / "data").mkdir()
    check_room({tmp_path / "data" / "model" / "deep": 10, tmp_path / "data": 10})
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == []  # no probe left
    real, original = shutil.disk_usage, tempfile.mkstemp
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda path: real(path)._replace(free=15_000_000))
    check_room({tmp_path / "data": 15_000_000})  # exactly the room there is
    with pytest.raises(WriteFault, match=r"it has 15 MB free, and this stage will write about "
                                         r"16 MB on its filesystem \(\[Errno 28\]"):
        check_room({tmp_path / "data" / "model": 8_000_000, tmp_path / "data": 8_000_000})

    def mkstemp(*args, dir=None, **kwargs):  # a folder of another user (errno 13)
        if Path(dir) == tmp_path / "data":
            raise OSError(errno.EACCES, "Permission denied", str(dir))
        return original(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    with pytest.raises(WriteFault) as err:
        check_room({tmp_path / "data" / "model": 0})
    assert str(err.value) == (f"cannot write {tmp_path / 'data'}: it is not writable ([Errno 13] "
                              "Permission denied); make it writable, then rerun `dvc repro`")
