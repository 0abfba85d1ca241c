"""What a user reads: `dvc exp show` and `dvc metrics show` with the headline figures only, and a
`dvc repro` console with wellfed's lines but none of Ray's or MLflow's internals, while a real
worker error still shows its message."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e.pipeline import details, make_project, mlflow_runs, run

pytestmark = pytest.mark.e2e

# DVC's metrics: the test headline only, so `dvc exp show` stays one screen wide.
HEADLINE = {"eval/accuracy", "eval/macro_f1", "eval/ece"}
# The train stage's figures: what it learned (data/train/metrics.json, committed) and how fast it
# went here (data/train/speed/metrics.json, this machine's only); all of them in MLflow too.
TRAIN = {"val/loss", "val/accuracy", "val/macro_f1", "train/rows", "train/best_step"}
SPEED = {"train/seconds", "train/real_tokens_per_s", "train/padding_efficiency",
         "train/input_wait_share", "train/mfu"}
# The last validation, when the exported model (train.select: best) is an earlier step's.
VAL_LAST = {"val_last/loss", "val_last/accuracy", "val_last/macro_f1"}
# Lines from Ray's and MLflow's own loggers, as each formats them.
NOISE = {
    "Ray Python logger": re.compile(r"\b(DEBUG|INFO|WARNING|ERROR) [\w.]+\.py:\d+ -- "),
    "Ray C++ log (core_worker.cc, ...)": re.compile(r"\[[\d-]+ [\d:,]+ [DIWE] \d+ \d+\] \w+\.cc:\d+"),
    "MLflow / alembic logger": re.compile(r"\b(INFO|WARNING)\s+\[?(mlflow|alembic)[\w.]*\]?:?"),
    "Ray raylet / log-dedup notice": re.compile(r"\(raylet\)|Ray deduplicates logs"),
    "a traceback": re.compile(r"Traceback \(most recent call last\)"),
}


def noise(console: str) -> list[str]:
    return [f"{name}: {line}" for line in console.splitlines()
            for name, pattern in NOISE.items() if pattern.search(line)]


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir):
    """A tiny pipeline run by `dvc repro` (its console kept), committed, then an experiment."""
    dest = tmp_path_factory.mktemp("console")
    make_project(dest, {"model": {"name": str(tiny_model_dir), "init": "random"},
                        "train": {"epochs": 1, "lr": 2e-3, "global_batch_size": 16,
                                  "micro_batch_size": 8, "eval_every": 10, "report_every": 5,
                                  "checkpoint_every": 10},
                        "ray": {"num_workers": 1, "cpus_per_worker": 1}},
                 {"train.tsv": 200, "dev.tsv": 50, "test.tsv": 50})
    proc = run(["dvc", "repro"], dest)
    run(["git", "add", "-A"], dest)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "run"], dest)
    run(["dvc", "exp", "run", "-S", "train.lr=0.004"], dest)
    return dest, proc.stdout + proc.stderr


def test_repro_console_has_wellfed_lines_and_no_ray_or_mlflow_internals(project):
    _, console = project
    for line in ("[wellfed] in process: 1 worker on ", "[wellfed] step 13/13",
                 "[wellfed] train done:", "fixed cost (all but steps)",
                 "[wellfed] evaluate on test (50 rows)", "[wellfed] pipeline ",
                 "[wellfed] tokenize train: 200 rows, ", "[wellfed] diagnosis: input wait"):
        assert line in console, line
    # A tiny CPU run is compute-bound, or, beside the tier's other worker, says the machine was
    # shared (its process got under half the CPUs it asked for): both are the honest finding.
    (finding,) = [line.split("[wellfed] bottleneck: ", 1)[1] for line in console.splitlines()
                  if "[wellfed] bottleneck: " in line]
    assert finding.startswith(("compute-bound on CPU", "the machine was shared")), finding
    assert noise(console) == [], console
    # No bar in a log (a finished one, or none), no dict repr, no Markdown: sentences for people.
    for left in ("%|", "{'rows'", "# wellfed diagnosis", "**Bottleneck", "| figure |"):
        assert left not in console, left


def test_every_stage_says_where_its_seconds_went_and_the_run_holds_the_pipelines(project):
    """Each stage ends with a line of its time budget and writes it (data/reports/time/), from
    process start; the last stage adds up its pipeline run, and the MLflow run holds that."""
    dest, console = project
    for stage in ("check", "prepare", "tokenize", "train", "evaluate"):
        assert re.search(rf"^\[wellfed\] {stage} [\d.]+ s: .+", console, re.M), stage
        record = json.loads((dest / "data/reports/time" / f"{stage}.json").read_text())
        parts = record["parts_s"]
        assert record["stage"] == stage and record["dvc"]["pid"] > 1
        assert list(parts)[0] == "start + imports" and 0 < parts["start + imports"]
        assert sum(parts.values()) <= record["total_s"] + 0.05
        assert sum(parts.values()) + record["other_s"] >= record["total_s"] - 0.05
    train = json.loads((dest / "data/reports/time/train.json").read_text())
    assert {"params", "mlflow run start", "steps", "validation", "checkpoints", "export",
            "mlflow model + registry"} <= set(train["parts_s"]), train["parts_s"]
    assert train["fixed_s"] == pytest.approx(train["total_s"] - train["parts_s"]["steps"],
                                             abs=0.01)
    line = re.search(r"^\[wellfed\] (pipeline ([\d.]+) s since dvc started: (.*); fixed cost "
                     r"\(all but steps\) [\d.]+ s)$", console, re.M)
    assert line and {p.split()[0] for p in line.group(3).split(", ")} == {
        "check", "prepare", "tokenize", "train", "evaluate", "dvc"}, console
    client, runs = mlflow_runs(dest)
    first, last = runs[0].data.metrics, runs[-1].data.metrics
    assert first["time/pipeline_s"] == pytest.approx(float(line.group(2)), abs=0.05)
    assert "time/pipeline_s" in last
    assert details(dest, runs[0])["pipeline_time"] == line.group(1)  # the console's line, whole
    # An experiment reruns the params check, train and evaluate: its pipeline is theirs and dvc's.
    pipeline = json.loads(Path(client.download_artifacts(runs[-1].info.run_id,
                                                         "time/pipeline.json")).read_text())
    assert [s["stage"] for s in pipeline["stages"]] == ["check", "train", "evaluate"]
    assert set(pipeline["stages_s"]) == {"check", "train", "evaluate"}


def test_git_dirty_is_the_code_not_the_outputs_the_stages_rewrote(project):
    """The experiment ran after the first run's outputs were committed: `dvc exp run -S` edited
    params.yaml and the stages rewrote dvc.lock and data/train/* before train read git."""
    _, runs = mlflow_runs(project[0])
    assert [r.data.tags["git.dirty"] for r in runs] == ["false"] * 2
    assert not [r for r in runs if "git.changed" in r.data.tags]


def flat(values: dict, prefix: str = "") -> list[str]:
    """params.yaml's keys as dvc's columns name them: nested sections joined by dots
    (`search.space.train.lr`)."""
    keys = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        keys += flat(value, f"{name}.") if isinstance(value, dict) and value else [name]
    return keys


def test_exp_show_has_the_headline_columns_and_few_metrics(project):
    dest, _ = project
    table = list(csv.DictReader(io.StringIO(run(["dvc", "exp", "show", "--csv"], dest).stdout)))
    params = set(flat(yaml.safe_load((dest / "params.yaml").read_text())))
    fixed = {"Experiment", "rev", "typ", "Created", "parent", "State", "Executor"}
    metrics = [c for c in table[0] if c not in fixed | params and not (dest / c).exists()]
    assert set(metrics) == HEADLINE, metrics
    experiments = [row for row in table if row["typ"] != "baseline"]
    assert [row["train.lr"] for row in experiments] == ["0.004"]
    assert all(0 <= float(row["eval/accuracy"]) <= 1 for row in experiments)


def test_a_headline_metric_has_the_same_name_and_value_in_mlflow(project):
    dest, _ = project
    dvc = {**json.loads((dest / "data/train/metrics.json").read_text()),
           **json.loads((dest / "data/train/speed/metrics.json").read_text()),
           **json.loads((dest / "data/eval/metrics.json").read_text())}
    assert HEADLINE | TRAIN | SPEED <= set(dvc) <= HEADLINE | TRAIN | SPEED | VAL_LAST
    client, runs = mlflow_runs(dest)
    assert len(runs) == 2  # the repro and the experiment; the workspace holds the last one
    logged = runs[-1].data.metrics
    step = dvc["train/best_step"]  # select: best, the exported model's step
    for key, value in dvc.items():
        if key.startswith("val"):  # MLflow keeps each validation at its step: the model's, the last
            history = client.get_metric_history(runs[-1].info.run_id, key.replace("_last", ""))
            at = max(m.step for m in history) if key.startswith("val_last/") else step
            assert [m.value for m in history if m.step == at] == [pytest.approx(value)], key
        else:
            assert logged[key] == pytest.approx(value), key


def test_metrics_show_and_diff_stay_small(project):
    dest, _ = project
    header = run(["dvc", "metrics", "show"], dest).stdout.splitlines()[0].split()
    assert header[0] == "Path" and set(header[1:]) == HEADLINE, header
    names = [row["Experiment"] for row in csv.DictReader(io.StringIO(
        run(["dvc", "exp", "show", "--csv"], dest).stdout)) if row["typ"] != "baseline"]
    assert len(names) == 1
    diff = run(["dvc", "metrics", "diff", "HEAD", *names], dest).stdout.splitlines()
    assert diff[0].split() == ["Path", "Metric", "HEAD", *names, "Change"], diff
    assert 0 < len(diff) - 1 <= len(HEADLINE)  # one row per changed headline figure
    assert {line.split()[1] for line in diff[1:]} <= HEADLINE, diff


@pytest.mark.parametrize("in_process", ["auto", "false"])
def test_a_worker_error_still_shows_its_message(project, tmp_path, in_process):
    """The weights a `model.init: pretrained` run needs are missing: the worker (in the stage's
    process, or on Ray Train) raises, and the stage ends with the worker's own message and says
    where its traceback is, not a quiet exit."""
    dest, _ = project
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-a", str(dest), str(broken)], check=True)
    params = yaml.safe_load((broken / "params.yaml").read_text())
    params["model"]["init"] = "pretrained"  # the tiny model directory holds a config, no weights
    params["ray"].update(max_failures=0, in_process=in_process)
    (broken / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = run(["dvc", "repro", "train"], broken, check=False)
    assert proc.returncode != 0
    last = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(last) == 1 and last[0].startswith("error: training failed (worker 0: OSError: "), \
        proc.stderr[-3000:]
    assert "no file named model.safetensors" in last[0]
    where = last[0].split("Full traceback: ")[1]
    if in_process == "auto":  # a file in the run's checkpoint folder
        assert Path(where).is_file() and "OSError" in Path(where).read_text(), last[0]
    else:
        assert where == "Ray's logs under /tmp/ray/session_latest/logs", last[0]
    console = proc.stdout + proc.stderr
    assert [n for n in noise(console) if not n.startswith("a traceback")] == [], console
