"""The champion alias by merit, on a real sqlite MLflow store (no training: versions are made
directly, each from its own run): the decision, a kill between the alias and its words, and two
evaluations that finish at the same instant in two processes."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from wellfed.track import champion, registry

NAME, ALIAS, METRIC = "demo-classifier", "champion", "eval/macro_f1"
SPLIT, OTHER = "a" * 64, "b" * 64
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """A store with MLflow's tables made (seconds under load), copied for each test."""
    path = tmp_path_factory.mktemp("empty") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture()
def store(tmp_path, empty_store):
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("demo")
    client.create_registered_model(NAME)

    def version(**params) -> str:
        run_id = client.create_run(experiment).info.run_id
        for key, value in params.items():  # the recipe: train_lr=3e-5 is the param train.lr
            client.log_param(run_id, key.replace("_", ".", 1), value)
        return str(client.create_model_version(NAME, f"{tmp_path}/model", run_id=run_id).version)

    return uri, client, version


def promote(uri: str, version: str, value: float, split: str = SPLIT, split_name: str = "test"):
    return champion.promote(uri, NAME, version, ALIAS, METRIC, value, split, split_name)


def holder(client) -> str:
    return str(client.get_model_version_by_alias(NAME, ALIAS).version)


def consistent(client) -> dict[str, str]:
    """Every scored version's reason, after checking that the holder's says `@champion`, every
    other's `not @champion`, and each description repeats its reason."""
    held = holder(client)
    reasons = {}
    for version in client.search_model_versions(f"name = '{NAME}'"):
        if registry.METRIC not in version.tags:
            continue
        text = version.tags[registry.REASON]
        assert text.startswith(f"@{ALIAS}: " if str(version.version) == held
                               else f"not @{ALIAS}: "), (version.version, held, text)
        assert version.description == champion.description(champion.scored(version), text,
                                                            ALIAS)
        reasons[str(version.version)] = text
    return reasons


def test_the_alias_moves_only_to_a_better_version_of_the_same_split(store):
    uri, client, version = store
    v1, v2 = version(), version()
    v3 = version(train_lr=3e-5, train_global_batch_size=32)
    first = promote(uri, v1, 0.80)
    assert first.moved and first.line() == (
        "models:/demo-classifier@champion -> version 1: eval/macro_f1 0.8000 on the test split; "
        "no other version was evaluated on this split")
    worse = promote(uri, v2, 0.70)
    assert not worse.moved and worse.holder == "1"
    assert "stays version 1: version 2 scored eval/macro_f1 0.7000" in worse.line()
    assert "not above version 1's 0.8000 on the same split" in worse.line()
    better = promote(uri, v3, 0.90)
    assert better.moved and holder(client) == "3"
    tags = client.get_model_version(NAME, "3").tags
    assert tags[registry.REASON] == ("@champion: eval/macro_f1 0.9000 on the test split beats "
                                     "version 1's 0.8000 on the same split")
    # The versions list shows a description's first ~40 characters: the figure, the recipe and
    # the verdict come first, the words after.
    assert client.get_model_version(NAME, "3").description == (
        "macro_f1 0.9000 · lr 3e-5 bs 32 · champion (@champion): eval/macro_f1 0.9000 on the "
        "test split beats version 1's 0.8000 on the same split")
    assert client.get_model_version(NAME, "1").description.startswith(
        "macro_f1 0.8000 · not champion (@champion): scored")  # its run logged no recipe
    assert tags[registry.PREVIOUS] == "1" and float(tags[registry.VALUE]) == 0.9
    assert tags[registry.SPLIT] == SPLIT and tags[registry.METRIC] == METRIC
    # The versions it passed say so too: their words follow the holder, not the past.
    assert consistent(client)["1"] == ("not @champion: scored eval/macro_f1 0.8000 on the test "
                                       "split, not above version 3's 0.9000 on the same split")
    again = promote(uri, v3, 0.90)  # evaluate rerun on the same run
    assert not again.moved and again.line() == (
        "models:/demo-classifier@champion stays version 3: eval/macro_f1 0.9000 on the test "
        "split beats version 1's 0.8000 on the same split")


def test_an_equal_score_or_another_split_or_nan_leaves_the_alias(store):
    uri, client, version = store
    v0, v1, v2, v3, v4 = version(), version(), version(), version(), version()
    nan = promote(uri, v0, math.nan)
    assert nan.line() == ("models:/demo-classifier@champion is not set: version 1 scored "
                          "eval/macro_f1 nan: not a finite figure, never ranked")
    promote(uri, v1, 0.80)
    assert not promote(uri, v2, 0.80).moved
    other = promote(uri, v3, 0.99, OTHER, "validation")
    assert not other.moved and "cannot be ranked" in other.reason
    assert "another split (test, fingerprint aaaaaaaaaaaa)" in other.reason
    assert not promote(uri, v4, math.nan).moved
    assert holder(client) == "2"
    again = promote(uri, v1, 0.80)  # re-evaluated
    assert not again.moved and again.holder == "2"
    consistent(client)


def test_a_hand_set_alias_without_a_record_is_never_taken_silently(store):
    uri, client, version = store
    v1, v2 = version(), version()
    client.set_registered_model_alias(NAME, ALIAS, v1)
    verdict = promote(uri, v2, 0.95)
    assert not verdict.moved and "no recorded evaluation" in verdict.reason
    assert holder(client) == "1"


def test_a_version_excluded_by_hand_gives_the_alias_to_the_best_of_the_rest(store):
    uri, client, version = store
    v1, v2, v3 = version(), version(), version()
    promote(uri, v1, 0.80)
    promote(uri, v2, 0.90)
    client.set_model_version_tag(NAME, v2, registry.EXCLUDE, "a leak in its training data")
    verdict = promote(uri, v3, 0.85)
    assert verdict.moved and holder(client) == "3"
    assert consistent(client)["2"] == ("not @champion: excluded by hand (tag "
                                       "wellfed.champion.exclude)")


def test_a_description_someone_wrote_is_left_alone(store):
    uri, client, version = store
    v1 = version()
    client.update_model_version(NAME, v1, description="the model we demoed on Tuesday")
    promote(uri, v1, 0.8)
    assert client.get_model_version(NAME, v1).description == "the model we demoed on Tuesday"
    assert client.get_model_version(NAME, v1).tags[registry.REASON].startswith("@champion: ")


@pytest.mark.parametrize("older", [
    "Champion (@champion): eval/macro_f1 0.8000 on the test split; no other version was evaluated "
    "on this split",
    "Not champion (@champion): scored eval/macro_f1 0.8000 on the test split, not above version "
    "2's 0.9000 on the same split"])
def test_a_description_an_older_wellfed_wrote_is_rewritten_not_kept_as_foreign(store, older):
    """Registries hold versions described in the heads wellfed wrote before the figure came
    first: still wellfed's, so the next evaluation brings them to the current format."""
    uri, client, version = store
    v1, v2 = version(train_lr=1e-4, train_global_batch_size=16), version()
    client.update_model_version(NAME, v1, description=older)
    assert champion.ours(older, ALIAS) and not champion.ours(older, "production")
    promote(uri, v1, 0.80)
    promote(uri, v2, 0.90)
    assert client.get_model_version(NAME, v1).description == (
        "macro_f1 0.8000 · lr 1e-4 bs 16 · not champion (@champion): scored eval/macro_f1 0.8000 "
        "on the test split, not above version 2's 0.9000 on the same split")
    consistent(client)


class Killed(BaseException):
    """What the process would have died of."""


def test_killed_between_the_alias_and_its_words_the_rerun_repairs_them(store, monkeypatch):
    """Version 2 lost once (its words: not @champion), is evaluated again with a better figure
    (evaluate's code changed), takes the alias and is killed before its words change: the
    champion said "not @champion" and a rerun ("holds it already") left it so."""
    uri, client, version = store
    v1, v2 = version(), version()
    promote(uri, v1, 0.80)
    promote(uri, v2, 0.70)
    real = mlflow.MlflowClient.set_registered_model_alias

    def killed_after(self, *args):
        real(self, *args)
        raise Killed

    monkeypatch.setattr(mlflow.MlflowClient, "set_registered_model_alias", killed_after)
    with pytest.raises(Killed):
        promote(uri, v2, 0.90)
    monkeypatch.undo()
    assert holder(client) == "2"
    assert client.get_model_version(NAME, v2).tags[registry.REASON].startswith("not @champion")
    rerun = promote(uri, v2, 0.90)
    assert rerun.holder == "2" and rerun.line() == (
        "models:/demo-classifier@champion stays version 2: eval/macro_f1 0.9000 on the test "
        "split beats version 1's 0.8000 on the same split")
    assert consistent(client) == {
        "1": "not @champion: scored eval/macro_f1 0.8000 on the test split, not above version "
             "2's 0.9000 on the same split",
        "2": "@champion: eval/macro_f1 0.9000 on the test split beats version 1's 0.8000 on the "
             "same split"}


def test_killed_between_the_words_of_two_versions_any_later_evaluation_repairs_them(
        store, monkeypatch):
    uri, client, version = store
    v1, v2, v3 = version(), version(), version()
    promote(uri, v1, 0.80)
    real, calls = mlflow.MlflowClient.set_model_version_tag, []

    def killed_at_the_second_reason(self, name, version_, key, value):
        calls.append(key)
        if calls.count(registry.REASON) == 2:
            raise Killed
        real(self, name, version_, key, value)

    monkeypatch.setattr(mlflow.MlflowClient, "set_model_version_tag", killed_at_the_second_reason)
    with pytest.raises(Killed):
        promote(uri, v2, 0.90)
    monkeypatch.undo()
    assert calls.count(registry.REASON) == 2 and holder(client) == "2"
    promote(uri, v3, 0.10)  # another run's evaluation, not a rerun of version 2's
    assert set(consistent(client)) == {"1", "2", "3"} and holder(client) == "2"


@pytest.mark.parametrize("refusal", [
    ("database is locked", "TEMPORARILY_UNAVAILABLE"),
    ("(sqlite3.IntegrityError) UNIQUE constraint failed: model_version_tags.key", "BAD_REQUEST")])
def test_a_write_refused_for_a_colliding_writer_is_tried_again_from_a_fresh_read(
        store, monkeypatch, refusal):
    """Two writers at once on sqlite: one is refused at once (TEMPORARILY_UNAVAILABLE), or both
    inserted the same new tag (a UNIQUE constraint): the refused evaluation reads again and
    finishes. Any other refusal is not retried."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos import databricks_pb2

    uri, client, version = store
    v1, v2, v3 = version(), version(), version()
    promote(uri, v1, 0.80)
    real, refused = mlflow.MlflowClient.set_model_version_tag, []
    message, code = refusal

    def refused_once(self, name, number, key, value):
        if key == registry.REASON and not refused:
            refused.append(key)
            raise MlflowException(message, error_code=getattr(databricks_pb2, code))
        real(self, name, number, key, value)

    monkeypatch.setattr(mlflow.MlflowClient, "set_model_version_tag", refused_once)
    assert promote(uri, v2, 0.90).moved and refused == [registry.REASON]
    assert holder(client) == "2" and set(consistent(client)) == {"1", "2"}
    refused.clear()
    monkeypatch.setattr(mlflow.MlflowClient, "set_model_version_tag", lambda *_: (
        _ for _ in ()).throw(MlflowException("no", error_code=databricks_pb2.BAD_REQUEST)))
    with pytest.raises(MlflowException, match="no"):
        promote(uri, v3, 0.95)


# Two evaluations at once, in two fresh processes (a sweep's trials finishing together).

def race_child(uri: str, folder: str, role: str, versions: str, values: str) -> None:
    """One of two racing evaluations: for each of its versions, wait for the parent's `go`
    line on stdin, promote it, print the line. Role "stale" reads the registry, then waits
    until the other process, role "fresh", which starts once it has read (`read` file), has
    finished (`done` file) before it writes anything: the widest window a read-then-write can
    have."""
    out = Path(folder)
    if role == "stale":
        real, reads = champion.read, []

        def read_then_wait(*args):
            standing = real(*args)
            reads.append(standing)
            if len(reads) == 1:
                (out / "read").touch()
                wait_for(out / "done")
            return standing

        champion.read = read_then_wait
    print("ready", flush=True)
    for version, value in zip(versions.split(","), map(float, values.split(","))):
        assert sys.stdin.readline().strip() == "go"
        if role == "fresh":
            wait_for(out / "read")
        print(promote(uri, version, value).line(), flush=True)
    if role == "fresh":
        (out / "done").touch()


def wait_for(path: Path, polls: int = 60_000) -> None:
    """Until `path` exists, looking every 5 ms (a count, not a clock: 5 minutes at most)."""
    for _ in range(polls):
        if path.exists():
            return
        time.sleep(0.005)
    raise TimeoutError(f"{path} never appeared")


def race(uri: str, folder: Path, *entrants: tuple[str, list[str], list[float]]) -> list[list[str]]:
    """Start one process per entrant (role, versions, values), release them together for each
    round (one `go` line to each, written back to back) and wait for both lines before the next;
    return the lines each printed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    procs = [subprocess.Popen(
        [sys.executable, "-c", "import sys; from tests.test_champion import race_child; "
         "race_child(*sys.argv[1:])", uri, str(folder), role, ",".join(versions),
         ",".join(map(str, values))], cwd=ROOT, env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for role, versions, values
        in entrants]
    lines: list[list[str]] = [[] for _ in procs]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                proc.kill()
                raise AssertionError(proc.stderr.read()[-3000:])
        for _ in entrants[0][1]:
            for proc in procs:
                proc.stdin.write("go\n")
            for proc in procs:
                proc.stdin.flush()  # the release: writes microseconds apart
            for out, proc in zip(lines, procs):
                out.append(proc.stdout.readline().strip())
        errors = [proc.communicate(timeout=600)[1] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [p.returncode for p in procs] == [0] * len(procs), [
        [line for line in err.splitlines() if "Error" in line or "Exception" in line][-3:]
        for err in errors]
    return lines


@pytest.mark.integration
def test_two_evaluations_released_together_leave_the_alias_on_the_better(store, tmp_path):
    """Three rounds, each two new versions released at the same instant against the holder;
    the better one of each round is alternately the first and the second process's."""
    uri, client, version = store
    promote(uri, version(), 0.50)
    values = [(0.60, 0.70), (0.80, 0.75), (0.85, 0.90)]
    first, second = zip(*[(version(), version()) for _ in values])
    race(uri, tmp_path, ("plain", list(first), [a for a, _ in values]),
         ("plain", list(second), [b for _, b in values]))
    assert holder(client) == second[2]  # 0.90, the best of all
    reasons = consistent(client)
    assert reasons[second[2]] == (f"@champion: eval/macro_f1 0.9000 on the test split beats "
                                  f"version {first[2]}'s 0.8500 on the same split")
    assert len(reasons) == 7


@pytest.mark.integration
def test_a_stale_read_that_writes_last_is_undone_by_its_own_recheck(store, tmp_path):
    """The widest window: one process reads (version 1 holds, 0.80), the other evaluates a
    better version and finishes, and only then does the first write what its stale read
    decided (its 0.85 beats 0.80). Read-then-write without a recheck left the alias on 0.85."""
    uri, client, version = store
    v1, v2, v3 = version(), version(), version()
    promote(uri, v1, 0.80)
    [stale], [fresh] = race(uri, tmp_path, ("stale", [v2], [0.85]), ("fresh", [v3], [0.90]))
    assert fresh == ("models:/demo-classifier@champion -> version 3: eval/macro_f1 0.9000 on "
                     "the test split beats version 2's 0.8500 on the same split")
    assert holder(client) == v3
    assert stale == ("models:/demo-classifier@champion is now version 3: version 2 scored "
                     "eval/macro_f1 0.8500 on the test split, not above version 3's 0.9000 on "
                     "the same split")
    assert consistent(client)[v3].startswith("@champion: eval/macro_f1 0.9000")
