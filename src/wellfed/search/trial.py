"""One search trial: the ordinary training loop (train/step/loop.py) in a warm Ray Tune worker,
reporting to Tune at its rungs.

Warm: Tune reuses each worker process from one trial to the next (`reuse_actors`), so a trial
pays no process start, no import of torch and transformers, no first touch of the token files
and no device peak probe: the first trial in a worker pays them once. Each trial still builds
its model afresh from the pretrained weights (the same `load_model` as the pipeline, so a
trial at full budget learns exactly what the winner's `dvc exp run` learns), and its own
optimizer, schedule and batch plan.

A trial reports once per validation: its step, every val/* figure, the training losses since
the last report (the child run's curve), and where its seconds went. ASHA decides at each rung
(search/story.py logs why); a trial it stops leaves the loop through `tune.report` (Tune ends
the function there), which is why the loop stops its sampler however it ends.

A trial the driver already recorded as finished (a search resumed after a kill) is not trained
again: its recorded reports are handed to Tune as they were, so the scheduler and the searcher
see the same search.
"""

from __future__ import annotations

import base64
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wellfed.config import DataConfig, ModelConfig, TrainConfig
from wellfed.search import space
from wellfed.search.space import config_key, recipe_of
from wellfed.search.console import trial_output

REPORT_KEYS = ("step", "trial_s", "loss", "records", "timing", "predicted", "phase", "seed")
"""What a trial's report holds beside the val/* figures."""


@dataclass(frozen=True)
class Setting:
    """What every trial of one search shares (tune.with_parameters hands it to each worker)."""

    train: TrainConfig
    model: ModelConfig
    data: DataConfig
    tokens_dir: str
    """This machine's token folder; on a multi-node cluster, each node's copy of `tokens_uri`."""
    model_source: str
    labels: tuple[str, ...]
    pad_id: int
    task: str
    rows: int
    """Train rows (for the epochs a budget needs)."""
    full: int
    """A trial's full budget in optimizer steps."""
    rungs: tuple[int, ...]
    """Where a trial validates: ASHA's milestones, `full` last."""
    threads: int
    use_gpu: bool
    finished: dict = dataclasses.field(default_factory=dict)
    """trial id, and `config_key` -> its recorded reports: trials a resumed search does not
    train again."""
    tokens_uri: str | None = None
    tokens_hash: str | None = None
    log_dir: str = ""
    """Where each trial's own output goes (`<trial id>.log`); "" drops it."""


def encode(ids: np.ndarray) -> str:
    """Predicted class ids, compactly (a final-check trial's last report carries them)."""
    return base64.b64encode(ids.astype(np.int32).tobytes()).decode()


def decode(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=np.int32)


def run_trial(config: dict, setting: Setting) -> None:
    """Tune's trainable (function API): train one recipe and report at every rung."""
    from ray import tune

    started = time.perf_counter()
    trial_id = tune.get_context().get_trial_id()
    recorded = setting.finished.get(trial_id, setting.finished.get(config_key(config)))
    if recorded is not None:  # a resumed search: recorded, not trained again
        for report in recorded:
            tune.report(report)
        return
    recipe, seed, phase = recipe_of(config)
    # The loop's lines (the model's size) and transformers' `Loading weights` bar would reach
    # the console through Ray's log forwarding, once per trial; the driver's lines and the
    # child runs say what matters. They go to the trial's log in the search folder.
    with trial_output(setting.log_dir, trial_id):
        train(recipe, seed, phase, setting, tune.report, started)


def train(recipe: dict, seed: int | None, phase: str, setting: Setting, send,
          started: float | None = None) -> None:
    """Train `recipe` (seed `seed`, else train.seed) as a trial of `setting`; every validation
    goes to `send(report)`. Plain function: the tests and the benchmark call it without Tune."""
    import torch

    from wellfed.train.step.loop import Place, TrainJob
    from wellfed.train.step.loop import train as loop_train

    started = time.perf_counter() if started is None else started
    train_cfg, model_cfg = space.applied(recipe, setting.train, setting.model)
    train_cfg = space.budgeted(train_cfg, setting.rows, setting.full,
                               seed if seed is not None else setting.train.seed)
    tokens = Path(setting.tokens_dir)
    if setting.tokens_uri:  # multi-node: this node's copy of the staged token files
        from wellfed.data.staging import localize

        tokens = localize(setting.tokens_uri, setting.tokens_hash)
    job = TrainJob(train_cfg, setting.data, model_cfg, tokens, setting.model_source,
                   setting.labels, setting.pad_id, setting.task)
    torch.set_num_threads(setting.threads)
    device = torch.device("cuda", 0) if setting.use_gpu and torch.cuda.is_available() \
        else torch.device("cpu")
    if device.type == "cuda":
        from wellfed import device as dev

        dev.use_device(device)
    records: list[list] = []

    def report(metrics: dict, directory) -> None:
        records.extend([r["step"], r["loss"], r["lr"]] for r in metrics["records"])
        val = metrics.get("val")
        if not val:
            return
        out = {"step": metrics["records"][-1]["step"], **val, "phase": phase,
               "seed": train_cfg.seed, "trial_s": round(time.perf_counter() - started, 3),
               "loss": float(np.mean([r[1] for r in records])) if records else math.nan,
               "records": records[:], "timing": dict(metrics.get("timing", {}))}
        logits = metrics.get("val_logits")
        if phase == "proof" and logits is not None and setting.task == "single_label":
            out["predicted"] = encode(np.asarray(logits).argmax(-1))
        records.clear()
        send(out)

    loop_train(job, Place(device, 0, 1, "trial"), report,
               validate_at=frozenset(setting.rungs), checkpoints=False)
