"""MLflow tells the story, through `dvc repro` and `dvc exp run` as a user runs them (tiny
random-init BERT, one worker in-process, real DVC and MLflow): three runs, one long and two
short, rank their registered versions for `@champion`; then every docs block marked as
tested (DVC metrics, wellfed-compare, DVC plots, serving and loading the champion) runs as
written, on this project."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.e2e.pipeline import PROJECT, env, make_project, mlflow_runs, run
from tests.services import free_port
from wellfed.track import champion, registry

pytestmark = pytest.mark.e2e

NAME = "wellfed-classifier"
ROWS = {"train.tsv": 400, "dev.tsv": 100, "test.tsv": 100}
# 6 epochs at lr 3e-3 teach the tiny model the demo data (test macro-F1 ~0.95); 3 steps do not.
PARAMS = {"train": {"epochs": 6, "lr": 3e-3, "global_batch_size": 16, "micro_batch_size": 16,
                    "eval_every": 20, "report_every": 5, "checkpoint_every": 0, "max_steps": 3},
          "ray": {"num_workers": 1, "cpus_per_worker": 1}}
MARKER = "<!-- runnable: tests/e2e/test_story.py runs every block marked like this one -->"
MARKED_PAGES = ("README.md", "docs/compare.md", "docs/model.md")
"""The pages that hold marked blocks, in the order the test runs them."""


@pytest.fixture(scope="module")
def story(tmp_path_factory, tiny_model_dir):
    """A short run (`dvc repro`, committed as the baseline), a long experiment that beats it,
    and a short experiment that does not."""
    dest = tmp_path_factory.mktemp("story")
    make_project(dest, {**PARAMS, "model": {"name": str(tiny_model_dir), "init": "random"}}, ROWS)
    consoles = [run(["dvc", "repro"], dest)]
    run(["git", "add", "-A"], dest)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "run"], dest)
    consoles.append(run(["dvc", "exp", "run", "-S", "train.max_steps=0"], dest))
    consoles.append(run(["dvc", "exp", "run", "-S", "train.max_steps=3", "-S", "train.lr=0.001"],
                        dest))
    return dest, [c.stdout + c.stderr for c in consoles]


def test_the_champion_is_the_best_version_by_the_headline_on_the_same_split(story):
    dest, consoles = story
    client, runs = mlflow_runs(dest)
    assert len(runs) == 3
    versions = [client.get_model_version(NAME, str(v)) for v in (1, 2, 3)]
    assert [v.run_id for v in versions] == [r.info.run_id for r in runs]
    value = [float(v.tags[registry.VALUE]) for v in versions]
    assert value[1] > value[0] and value[2] <= value[1], value  # the long run is the best
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "2"
    assert len({v.tags[registry.SPLIT] for v in versions}) == 1  # one test split, one fingerprint
    rival = 1 if value[0] >= value[2] else 3  # the best of the others
    assert versions[1].description == champion.description(
        champion.scored(versions[1]), versions[1].tags[registry.REASON], "champion")
    assert versions[1].description.startswith(f"macro_f1 {value[1]:.4f} · lr ")  # its recipe
    assert versions[1].tags[registry.REASON] == (
        f"@champion: eval/macro_f1 {value[1]:.4f} on the test split beats version {rival}'s "
        f"{value[rival - 1]:.4f} on the same split")
    assert versions[1].tags[registry.PREVIOUS] == "1"
    for other in (0, 2):  # their words follow the holder: version 2
        assert versions[other].tags[registry.REASON] == (
            f"not @champion: scored eval/macro_f1 {value[other]:.4f} on the test split, not "
            f"above version 2's {value[1]:.4f} on the same split")
    assert f"[wellfed] models:/{NAME}@champion -> version 1: " in consoles[0]
    assert f"[wellfed] models:/{NAME}@champion -> version 2: " in consoles[1]
    assert f"[wellfed] models:/{NAME}@champion stays version 2: version 3 scored" in consoles[2]


def test_each_logged_model_shows_its_version_and_its_test_figures(story):
    dest, _ = story
    client, runs = mlflow_runs(dest)
    assert len(runs) == 3
    for number, run_ in enumerate(runs, start=1):
        version = client.get_model_version(NAME, str(number))
        model = client.get_logged_model(version.source.removeprefix("models:/"))
        assert model.source_run_id == run_.info.run_id
        assert json.loads(model.tags["mlflow.modelVersions"]) == [{"name": NAME,
                                                                  "version": str(number)}]
        on_test = {m.key: m.value for m in model.metrics if m.dataset_name == "tokens/test"}
        assert on_test == {k: run_.data.metrics[k] for k in
                           ("eval/accuracy", "eval/macro_f1", "eval/ece")}


def test_the_run_note_leads_with_the_headline_and_links_stay_in_the_training_view(story):
    dest, consoles = story
    _, runs = mlflow_runs(dest)
    long_run = runs[1]
    note = long_run.data.tags["mlflow.note.content"]
    first = note.splitlines()[0]
    assert first.startswith("### ") and \
        f"**eval/macro_f1 {long_run.data.metrics['eval/macro_f1']:.4f}**" in first
    for words in ("single_label, 3 classes", "train 400, validation 100, test 100 rows",
                  "real tokens/s", "MFU", "padding efficiency", "Bottleneck:",
                  f"[models:/{NAME}/2](#/models/{NAME}/versions/2?workflowType=machine_learning)",
                  f"now `models:/{NAME}@champion`", "eval/per_class.json"):
        assert words in note, words
    links = re.findall(r"http://127\.0\.0\.1:5000/\S+", "\n".join(consoles))
    assert len(links) == 6  # per run: the registered version and the run page
    assert all(link.endswith("?workflowType=machine_learning") for link in links), links
    assert not [k for k in long_run.data.params if k.startswith("derived.")]
    assert long_run.data.tags["derived.engine"] == "in_process"


def marked_blocks() -> list[tuple[str, str]]:
    """(language, text) of every code block of the README and the docs marked as run by this
    test; a marked block on a page this test does not read fails it."""
    blocks = {}
    for page in [PROJECT / "README.md", *sorted((PROJECT / "docs").rglob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        found = re.findall(re.escape(MARKER) + r"\n```(\w+)\n(.*?)\n```", text, re.S)
        if found:
            blocks[str(page.relative_to(PROJECT))] = found
    assert set(blocks) <= set(MARKED_PAGES), f"marked blocks outside {MARKED_PAGES}: {blocks}"
    return [block for page in MARKED_PAGES for block in blocks.get(page, [])]


def as_script(block: str, names: dict[str, str]) -> str:
    """A marked bash block as a script: placeholders filled, and `mlflow models serve` (which
    runs until stopped) started in its own process group on a free port, waited for and stopped
    at the end."""
    for placeholder, value in names.items():
        block = block.replace(placeholder, value)
    port = str(free_port())
    lines = ["set -euo pipefail"]
    for line in block.replace("\\\n", " ").splitlines():
        line = line.replace("5001", port)
        if line.startswith("mlflow models serve"):
            lines += [f"setsid {line.split('  #')[0]} > serve.log 2>&1 &",
                      'trap "kill -- -$! 2>/dev/null" EXIT',
                      f"for i in $(seq 180); do curl -sf -o /dev/null http://127.0.0.1:{port}/ping"
                      " && break; sleep 1; done"]
        elif line.strip() and not line.lstrip().startswith("#"):
            lines.append(line)
    return "\n".join(lines) + "\n"


def test_every_marked_docs_command_runs_as_written(story):
    dest, _ = story
    client, runs = mlflow_runs(dest)
    experiments = [r.data.tags["dvc.exp_name"] for r in runs[1:]]
    names = {"<exp-a>": experiments[0], "<exp-b>": experiments[1],
             "<run-id-a>": runs[0].info.run_id, "<run-id-b>": runs[2].info.run_id}
    blocks = marked_blocks()
    assert [lang for lang, _ in blocks] == ["bash", "bash", "bash", "bash", "python"], blocks
    outputs = []
    for lang, block in blocks:
        if lang == "python":
            code = block.replace("sqlite:////path/to/project/mlflow.db",
                                 f"sqlite:///{dest / 'mlflow.db'}")
            # As in a notebook, the last expression's value is what a reader sees: print it.
            code = "\n".join(f"print({line})" if line.startswith("model.predict(") else line
                              for line in code.splitlines())
            proc = subprocess.run(["python", "-c", code], cwd=dest, env=env(), text=True,
                                  capture_output=True, timeout=300)
        else:
            proc = subprocess.run(["bash", "-c", as_script(block, names)], cwd=dest, env=env(),
                                  text=True, capture_output=True, timeout=600)
        assert proc.returncode == 0, f"{block}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert "failed to load" not in proc.stderr, proc.stderr  # DVC's missing-metrics warning
        outputs.append(proc.stdout)
    metrics, compare, plots, serve, load = outputs
    assert "eval/macro_f1" in metrics and experiments[0] in metrics
    assert compare.count("verdict: B - A macro-F1 (the headline)") == 3
    assert f"A: MLflow run {runs[1].info.run_id} (models:/{NAME}@champion = version 2)" in compare
    assert (dest / "compare.json").is_file() and (dest / "dvc_plots" / "index.html").is_file()
    assert json.loads(serve)["predictions"][0]["label"] in {"negative", "neutral", "positive"}
    assert "label" in load and "prob_negative" in load


def test_a_clone_compares_with_its_committed_baseline_without_warnings(story, tmp_path):
    """The committed run's metrics files are in git: a fresh clone's `dvc metrics diff` and
    `dvc exp show` have a baseline, and DVC warns of no revision it could not read."""
    dest, _ = story
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(dest), str(clone)], tmp_path)
    for command in (["dvc", "metrics", "diff"], ["dvc", "exp", "show", "--csv"]):
        proc = run(command, clone)
        assert "failed to load" not in proc.stderr, (command, proc.stderr)
    baseline = run(["dvc", "metrics", "show", "--json"], clone).stdout
    assert "eval/macro_f1" in baseline and "val/macro_f1" in baseline
