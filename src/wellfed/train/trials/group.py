"""A group of trials trained as one: which trials can share one, and its training loop.

The loop is the step engine's (train/step/loop.py) with a trial dimension: the same batch plan and
feeding (train/step/setup.py, train/step/feeding.py), one fused forward and backward per
micro-batch, the trials' own updates (trials/update.py), and at each of `validate_at` one fused
validation pass for the whole group, after which `decide` may keep the best trials only (their
slices of the weights and optimizer state go on, the rest are dropped). Trials of one seed share
each micro-batch; trials of different seeds bring their own (trials/apart.py).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from wellfed import device as dev
from wellfed import tasks
from wellfed.config import TrainConfig
from wellfed.data.batching import collate, eval_batches
from wellfed.data.token_files import TokenFile
from wellfed.model import load_model
from wellfed.train.checkpoints import random_state
from wellfed.train.step.setup import setup
from wellfed.train.trials import apart, resume
from wellfed.train.trials.layers import TrialModel
from wellfed.train.trials.update import Recipe, TrialAdamW

VARIES = ("lr", "weight_decay", "warmup_ratio", "max_grad_norm")
"""The train keys fused trials may differ in; every other key shapes the model, the batches or
the budget, which the group shares."""
APART = ("seed",)
"""A key trials of one group may also differ in, each then with its own batches, dropout and
initialisation (trials/apart.py): not a key a search searches, the final check's seeds."""


def recipe(cfg: TrainConfig) -> Recipe:
    return Recipe(cfg.lr, cfg.weight_decay, cfg.warmup_ratio, cfg.max_grad_norm)


def refusal(configs: list[TrainConfig], models: list | None = None) -> str | None:
    """Why these trials cannot train as one group (one line), or None. `models` are their
    ModelConfigs, which must agree (a LoRA rank or an init changes the model itself)."""
    first = configs[0]
    for i, cfg in enumerate(configs[1:], 1):
        for f in dataclasses.fields(cfg):
            if f.name not in VARIES + APART and getattr(cfg, f.name) != getattr(first, f.name):
                return (f"trial {i} has train.{f.name}={getattr(cfg, f.name)!r} where trial 0 "
                        f"has {getattr(first, f.name)!r}: fused trials may differ only in "
                        f"{', '.join('train.' + v for v in VARIES + APART)}; group them by that "
                        "value or train them one by one")
    for i, m in enumerate((models or [])[1:], 1):
        if m != models[0]:
            diff = next(f.name for f in dataclasses.fields(m)
                        if getattr(m, f.name) != getattr(models[0], f.name))
            return (f"trial {i} has model.{diff}={getattr(m, diff)!r} where trial 0 has "
                    f"{getattr(models[0], diff)!r}: it changes the model, which fused trials "
                    "share; group them by that value or train them one by one")
    if first.precision == "fp16":
        return ("train.precision fp16 needs a loss scaler per trial, which fused trials do not "
                "have: use bf16 or fp32")
    if (models or [None])[0] is not None and models[0].lora_r:
        return ("model.lora_r > 0: a LoRA model's adapters are not plain Linear layers, which "
                "fused trials need; train LoRA trials one by one")
    return None


@dataclass
class GroupRun:
    """What a group did: each trial's records (by its index in the group as given)."""

    history: dict[int, list[dict]] = field(default_factory=dict)
    validations: dict[int, list[dict]] = field(default_factory=dict)
    logits: dict[int, object] = field(default_factory=dict)
    """Each trial's last validation logits (rows in file order), with `keep_logits`."""
    steps: dict[int, int] = field(default_factory=dict)
    """Optimizer steps each trial was trained for."""
    seconds: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    """real: each trial's non-pad tokens, summed; computed: the tokens the group computed;
    alone: the tokens its trials would have computed alone (less than computed where trials of
    different seeds pad their own batches to one shape)."""
    resumed_at: int = 0
    """The step a group started from a saved rung went on from (0: it started afresh)."""


def train_group(job, configs: list[TrainConfig], place, *, validate_at=frozenset(),
                decide: Callable[[int, dict[int, dict]], list[int]] | None = None,
                keep_logits: bool = False, saved: Path | None = None,
                start: list[Path] | None = None, stop_at: int = 0,
                slices: dict[int, Path] | None = None) -> GroupRun:
    """Train the trials `configs` (one TrainJob `job` otherwise: its train section is the
    group's shared recipe) as one model on `place.device`, each as it would train alone with
    train.seed. At each step of `validate_at` and at the end, all alive trials validate in one
    pass; `decide(step, {trial: figures})` then returns the trials that go on (None: all).
    With `saved`, the group's state is written there at each validation it goes on from, and
    a group started where that file is goes on from it (trials/resume.py).

    A group of a search that halves across all its trials trains one rung at a time: `start`
    (one file per trial, in `configs`' order) is where its trials go on from, `stop_at` the
    step it stops at after validating, `slices` (trial index -> file) where each trial's state
    is written there (trials/resume.py's `save_each` and `merged`)."""
    why = refusal(configs)
    if why:
        raise ValueError(why)
    started = time.perf_counter()
    cfg, device = configs[0], place.device
    shared = dataclasses.replace(job.train, **{k: getattr(cfg, k) for k in VARIES + APART})
    train_data = TokenFile(job.tokens_dir / "train.arrow")
    val_data = TokenFile(job.tokens_dir / "validation.arrow")
    torch.manual_seed(cfg.seed)  # the head's init, as a trial alone draws it
    model = load_model(job.model, job.model_source, list(job.labels), job.pad_id,
                       task=job.task).to(device)
    s = setup(dataclasses.replace(shared, cuda_graphs="false", compile=False), model,
              len(train_data), device, 1, job.task,
              tasks.loss_weights(job.task, cfg.class_weights, train_data.labels,
                                 list(job.labels)), lengths=train_data.lengths)
    fused = TrialModel(s.model, len(configs)).to(device)
    fused.train()
    seeds = list(dict.fromkeys(c.seed for c in configs))  # each seed's own batches
    of = [seeds.index(c.seed) for c in configs]
    if len(seeds) > 1:
        own_starts(fused, job, configs, device)
        fused.streams = apart.Streams.seeded([c.seed for c in configs], device)
    opt = TrialAdamW(list(fused.named_parameters()), [recipe(c) for c in configs], s.steps)
    alive = list(range(len(configs)))
    out = GroupRun(history={k: [] for k in alive}, validations={k: [] for k in alive},
                   tokens={"real": 0, "computed": 0, "alone": 0})
    state = (resume.merged(start) if start else
             resume.load(saved, len(configs), [c.seed for c in configs]))
    done, at = 0, (0, 0)
    if state:
        alive = resume.restore(state, fused, opt, out, device, cfg.seed)
        done, at = state["done"], tuple(state["next_at"])
        out.resumed_at = done
        out.tokens.setdefault("alone", out.tokens["computed"])  # a state from before "alone"
    elif len(seeds) == 1:
        random_state.seed(cfg.seed, place.rank)  # dropout, as the loop seeds a run at step 0
    fed = apart.feeds(s, seeds, train_data, job.tokens_dir / "train.arrow", job.pad_id, *at,
                      cfg.epochs, job.data.loader_workers, job.data.prefetch)
    out.seconds["setup"] = time.perf_counter() - started
    t_steps = t_val = 0.0
    pending: list = []  # steps whose losses are still on the device (read at a validation)
    for fed_step in fed:
        if done >= s.steps or not alive or done == stop_at > 0:
            break
        steps, batches = [f[0] for f in fed_step], [f[1] for f in fed_step]
        step = steps[0]
        t0 = time.perf_counter()
        if len(seeds) == 1:
            loss, norms = fused_step(fused, opt, s, step, batches[0], job.task, len(alive))
            computed = step.padded_tokens * len(alive)
        else:
            loss, norms, computed = apart.step_apart(fused, opt, s, steps, batches,
                                                     [of[k] for k in alive], job.task,
                                                     job.pad_id)
        done += 1
        records = [{"step": done, "lr": lr, "real_tokens": steps[of[k]].real_tokens}
                   for k, lr in zip(alive, opt.lrs())]
        for k, record in zip(alive, records):
            out.history[k].append(record)
        pending.append((records, loss, norms))
        out.tokens["real"] += sum(steps[of[k]].real_tokens for k in alive)
        out.tokens["alone"] += sum(steps[of[k]].padded_tokens for k in alive)
        out.tokens["computed"] += computed
        t_steps += time.perf_counter() - t0
        if done in validate_at or done >= s.steps or done == stop_at:
            figures_of(pending)
            t0 = time.perf_counter()
            figures, logits = validate(fused, s, val_data, job, keep_logits)
            t_val += time.perf_counter() - t0
            by_trial = {}
            for pos, k in enumerate(alive):
                out.validations[k].append({"step": done, **figures[pos]})
                out.history[k][-1].update(figures[pos])
                out.steps[k] = done
                if keep_logits:
                    out.logits[k] = logits[pos]
                by_trial[k] = figures[pos]
            kept = decide(done, by_trial) if decide is not None and done < s.steps else None
            if kept is not None and kept != alive:
                positions = [alive.index(k) for k in kept]
                fused.keep(positions)
                opt.keep(positions, list(fused.named_parameters()))
                alive = list(kept)
            group = dict(done=done, alive=alive, trials=len(configs), fused=fused, opt=opt,
                         seeds=[configs[k].seed for k in alive],
                         next_at=(step.epoch, step.index + 1), out=out, device=device)
            if slices is not None and done == stop_at < s.steps:
                resume.save_each(slices, **group)
            elif saved is not None and done < s.steps:
                resume.save(saved, **group)
    figures_of(pending)
    for k in alive:
        out.steps[k] = done
    out.seconds.update(steps=t_steps, validation=t_val,
                       total=time.perf_counter() - started)
    return out


def own_starts(fused: TrialModel, job, configs: list[TrainConfig], device) -> None:
    """Each trial's weights as it initialises them alone (the head, or a random-init model,
    drawn with its own seed): the model loaded once per seed other than the first trial's."""
    import contextlib
    import io

    loaded = {configs[0].seed: None}
    for k, cfg in enumerate(configs):
        if cfg.seed not in loaded:
            torch.manual_seed(cfg.seed)
            with contextlib.redirect_stdout(io.StringIO()):
                loaded[cfg.seed] = load_model(job.model, job.model_source, list(job.labels),
                                              job.pad_id, task=job.task)
        if loaded[cfg.seed] is not None:
            fused.load_trial(k, loaded[cfg.seed])


def figures_of(pending: list) -> None:
    """Fill the pending steps' records with each trial's loss and gradient norm: one copy from
    the device for all of them, as the loop reads its losses once per report."""
    if not pending:
        return
    losses = torch.stack([p[1] for p in pending]).tolist()
    norms = torch.stack([p[2] for p in pending]).tolist()
    for (records, _, _), loss, norm in zip(pending, losses, norms):
        for record, value, grad in zip(records, loss, norm):
            record.update(loss=value, grad_norm=grad)
    pending.clear()


def fused_step(fused: TrialModel, opt: TrialAdamW, s, step, batches, task: str,
               trials: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step of every trial: forward and backward of the step's micro-batches
    (each trial's loss normalised as a run alone normalises it), clip, update. Returns each
    trial's loss and gradient norm, (K,) each, still on the device."""
    loss_sum = torch.zeros(trials, device=s.device)
    for _ in step.micro:
        host = next(batches)
        batch = dev.to_device(host, s.device)
        padded = not bool(host["attention_mask"].all())  # as dev.forward decides alone
        with dev.autocast(s.device, s.precision):
            logits = fused(batch["input_ids"], batch["attention_mask"] if padded else None,
                           batch.get("token_type_ids"))
        rows = torch.stack([tasks.row_loss(task, logits[k], batch["labels"], s.loss_weights)
                            for k in range(trials)])
        loss = (rows * batch["weights"]).sum(dim=1) * s.world / step.global_rows
        loss.sum().backward()
        loss_sum += loss.detach()
    norms = opt.clip()
    opt.step()
    opt.zero_grad()
    return loss_sum, norms.detach()


def validate(fused: TrialModel, s, data: TokenFile, job, keep_logits: bool = False):
    """Every trial's validation figures (as train/step/validation.py computes a run's) from one
    fused pass over the length-sorted split; with `keep_logits` each trial's logits in file
    order."""
    import numpy as np

    fused.eval()
    k, n_classes = fused.trials, len(job.labels)
    totals, kept = [None] * k, []
    with torch.no_grad():
        for idx in eval_batches(data.lengths, s.spec, 0):
            host = collate(data, idx, job.pad_id, s.spec)
            batch = dev.to_device(host, s.device)
            padded = not bool(host["attention_mask"].all())
            with dev.autocast(s.device, s.precision):
                logits = fused(batch["input_ids"], batch["attention_mask"] if padded else None,
                               batch.get("token_type_ids"))
            n = len(idx)
            for t in range(k):
                sums = tasks.val_stats(job.task, logits[t, :n], batch["labels"][:n])
                totals[t] = sums if totals[t] is None else totals[t] + sums
            if keep_logits:
                kept.append((idx, logits[:, :n].float()))
    fused.train()
    figures = [tasks.val_metrics(job.task, t.tolist(), n_classes) for t in totals]
    rows = None
    if keep_logits:
        rows = np.zeros((k, len(data), n_classes), np.float32)
        for idx, values in kept:
            rows[:, idx] = values.cpu().numpy()
    return figures, rows
