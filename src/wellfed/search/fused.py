"""The search with fused trials (train/trials/): a group of K trials trains as one model, one
Ray task on one device (ray.gpus_per_worker > 0: a whole GPU; a CPU: the node's cores), so the
same search runs on a cluster. Here: whether a search can fuse, K (chosen once per search from
the device, train/trials/sizing.py, printed and recorded on the parent run), a group's task and
its results as a search trial reports them, and the final check's groups (the finalists x
seeds, grouped by search/halving.py's `proof_grouping`: across seeds on a GPU, by seed on a CPU;
each group writing its state at the rungs to `groups/` in the search's folder and going on from
there after a stop: train/trials/resume.py). The search phase's successive
halving across all its trials, group by group and rung by rung, is search/rounds.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import time
from pathlib import Path

import numpy as np

from wellfed.config import SearchConfig
from wellfed.outputs import write_json
from wellfed.search import space
from wellfed.search.console import trial_output
from wellfed.search.trial import Setting, encode

SIZING_TRIALS = 16
"""The largest group sizing is asked about (the search's trials, when fewer)."""


def refusal(cfg: SearchConfig, setting: Setting) -> str | None:
    """Why this search's trials cannot train fused (one line), or None."""
    return refusal_of(cfg, setting.train, setting.model)


def refusal_of(cfg: SearchConfig, train_cfg, model_cfg) -> str | None:
    """`refusal` from the search's train and model sections (before its Setting is made)."""
    from wellfed.train.trials.group import VARIES, refusal as group_refusal

    for d in cfg.dimensions():
        section, key = d.key.split(".", 1)
        if section != "train" or key not in VARIES:
            return (f"search.space.{d.key} changes what fused trials share (the model, the "
                    f"batches or the budget): they may differ only in "
                    f"{', '.join('train.' + v for v in VARIES)}")
    return group_refusal([train_cfg, train_cfg], [model_cfg, model_cfg])


def fused(cfg: SearchConfig, setting: Setting) -> bool:
    """Whether this search trains fused (search.fuse), said in one line when it does not."""
    if cfg.fuse == "false":
        return False
    why = refusal(cfg, setting)
    if why is None:
        return True
    if cfg.fuse == "true":
        raise ValueError(f"search.fuse is true but {why}; set search.fuse: auto (or false) to "
                         "train these trials one at a time with ASHA")
    print(f"[wellfed] trials one at a time with ASHA (search.fuse auto): {why}", flush=True)
    return False


def group_size(cfg: SearchConfig, setting: Setting, client, parent: str, folder) -> int:
    """K, the trials per fused group, chosen on the device a group gets (a Ray task), printed
    and recorded on the parent run; a resumed search keeps its K. 1: a fused step is not
    cheaper here, so groups of one, still halved in step across the search (fewer steps than
    ASHA), or on a cluster of several nodes 0: one at a time with ASHA, side by side."""
    if not fused(cfg, setting):
        return 0
    import ray

    kept = folder / "fused.json"
    if kept.is_file():
        chosen = json.loads(kept.read_text())
        k, reason = int(chosen["k"]), chosen["reason"] + " (chosen when the search began)"
        if k == 1 and "halving" not in chosen:  # begun by a wellfed that took 1 for ASHA
            print(f"[wellfed] trials one at a time with ASHA, as when the search began: {reason}",
                  flush=True)
            return 0
    else:
        need, threads = place_group(setting)
        wanted = min(cfg.trials, SIZING_TRIALS)
        choice = ray.get(ray.remote(size).options(**need).remote(setting, wanted,
                                                                       threads))
        k, reason = choice.trials, choice.reason
        if k == 1 and cfg.fuse == "true":  # asked for by name: fused, the smallest useful K
            k, reason = min(cfg.trials, 4), reason + "; search.fuse true: fused anyway"
        write_json(kept, {"k": k, "reason": reason, "halving": "across the search"})
        client.set_tag(parent, "wellfed.search.fused", f"K={k}: {reason}")
        client.log_param(parent, "search.fused_trials", k)
    if k > 1:
        print(f"[wellfed] fused trials: {k} per group, successive halving in step across the "
              f"search ({reason})", flush=True)
        return k
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    if nodes > 1:  # ASHA fits trials of ray.cpus_per_worker on every node and waits at no
        # rung; a group of one takes a node's worth of CPUs and waits for its rung's others
        print(f"[wellfed] trials one at a time with ASHA, side by side on the cluster's {nodes} "
              f"nodes: {reason}", flush=True)
        return 0
    print(f"[wellfed] trials in groups of one, successive halving in step across the search "
          f"(fewer steps than ASHA's): {reason}", flush=True)
    return 1


def groups_at_once(need: dict) -> int:
    """How many groups Ray can train side by side: one per GPU where a group takes a GPU (and
    its CPUs), else one per node's worth of CPUs."""
    import ray

    total = ray.cluster_resources()
    fit = int(total.get("CPU", 0) // max(1, need.get("num_cpus", 1)))
    if need.get("num_gpus"):
        fit = min(fit, int(total.get("GPU", 0) // need["num_gpus"]))
    return max(1, fit)


def place_group(setting: Setting, k: int = 0) -> tuple[dict, int]:
    """What a group asks Ray for and its torch threads: a whole GPU; on CPUs one node's (a
    group of `k` fused trials, or the sizing), or a trial's own, ray.cpus_per_worker (a group
    of one, placed as ASHA places a trial: on this 2-core machine two such groups side by side
    on one thread each step faster than one on both)."""
    import ray

    if setting.use_gpu:
        return {"num_cpus": setting.threads, "num_gpus": 1}, setting.threads
    if k == 1:
        return {"num_cpus": setting.threads}, setting.threads
    cpus = max(int(n.get("Resources", {}).get("CPU", 1)) for n in ray.nodes() if n.get("Alive"))
    return {"num_cpus": cpus}, cpus


def job_of(setting: Setting, recipe: dict, seed: int):
    from pathlib import Path

    from wellfed.train.step.loop import TrainJob

    train_cfg, model_cfg = space.applied(recipe, setting.train, setting.model)
    train_cfg = space.budgeted(train_cfg, setting.rows, setting.full, seed)
    tokens = Path(setting.tokens_dir)
    if setting.tokens_uri:
        from wellfed.data.staging import localize

        tokens = localize(setting.tokens_uri, setting.tokens_hash)
    return TrainJob(train_cfg, setting.data, model_cfg, tokens, setting.model_source,
                    setting.labels, setting.pad_id, setting.task)


def device_for(setting: Setting, threads: int):
    import torch

    torch.set_num_threads(threads)
    if setting.use_gpu and torch.cuda.is_available():
        from wellfed import device as dev

        device = torch.device("cuda", 0)
        dev.use_device(device)
        return device
    return torch.device("cpu")


def size(setting: Setting, wanted: int, threads: int):
    """K for this search (a Ray task on the device a group gets): train/trials/sizing.py. The
    model's loading lines (transformers' `Loading weights` bar, on stderr) go to the search's
    `trials/sizing.log`, as a trial's go to its own."""
    import torch

    from wellfed.data.token_files import TokenFile
    from wellfed.model import load_model
    from wellfed.train.trials import sizing

    device = device_for(setting, threads)
    job = job_of(setting, {}, setting.train.seed)
    lengths = TokenFile(job.tokens_dir / "train.arrow").lengths
    with trial_output(setting.log_dir, "sizing"):
        torch.manual_seed(0)
        model = load_model(job.model, job.model_source, list(job.labels), job.pad_id,
                           task=job.task).to(device)
    rows = job.train.micro_batch_size
    width = int(lengths.max() if device.type == "cuda" else np.ceil(np.mean(lengths)))
    return sizing.choose(model, wanted, rows, width, job.pad_id, device)


def train_group(setting: Setting, members: list[tuple[dict, int]], threads: int,
                saved: str | None = None, start: list[str] | None = None, stop_at: int = 0,
                slices: list[str] | None = None, name: str = "group") -> list[dict]:
    """Train `members` ((recipe, seed) each; seeds may differ: train/trials/apart.py) as one
    group, its state at each rung kept in `saved` (and gone on from where it is); returns per
    member {"reports": [...], "resumed_at": the step it went on from, 0 if none, "tokens": the
    group's real, computed and alone token counts} as a search trial reports them. A group of
    a search halving across all its trials (search/rounds.py) goes on from its members' `start`
    files, stops at `stop_at` and writes each member's state to its `slices` file. Its output
    (the loop's lines, transformers' `Loading weights` bar on stderr) goes to the search's
    `trials/<name>.log` (`name`: its trials' ids), as a trial's does with ASHA
    (search/console.py)."""
    from wellfed.train.step.loop import Place
    from wellfed.train.trials.group import train_group as run

    started = time.perf_counter()
    device = device_for(setting, threads)
    jobs = [job_of(setting, recipe, seed) for recipe, seed in members]
    with trial_output(setting.log_dir, name):
        out = run(jobs[0], [j.train for j in jobs], Place(device, 0, 1, "group"),
                  validate_at=frozenset(setting.rungs),
                  keep_logits=setting.task == "single_label",
                  saved=Path(saved) if saved else None,
                  start=[Path(f) for f in start] if start else None, stop_at=stop_at,
                  slices={k: Path(f) for k, f in enumerate(slices)} if slices else None)
    results = []
    for k, job in enumerate(jobs):
        reports, last = [], 0
        for val in out.validations[k]:
            records = [[r["step"], r["loss"], r["lr"]] for r in out.history[k]
                       if last < r["step"] <= val["step"]]
            report = {**val, "phase": "", "seed": job.train.seed,
                      "trial_s": round(time.perf_counter() - started, 3),
                      "loss": float(np.mean([r[1] for r in records])) if records else math.nan,
                      "records": records, "timing": dict(out.seconds)}
            last = val["step"]
            reports.append(report)
        if out.steps[k] >= setting.full and k in out.logits:
            reports[-1]["predicted"] = encode(np.asarray(out.logits[k]).argmax(-1))
        results.append({"reports": reports, "resumed_at": out.resumed_at,
                        "tokens": dict(out.tokens)})
    return results


@contextlib.contextmanager
def polite_stop():
    """SIGTERM (SLURM, a spot VM's notice) stops as Ctrl-C does, by KeyboardInterrupt; yields
    the list that holds it once received."""
    received: list[int] = []

    def polite(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, polite)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def proposed(states: Path, members: list[tuple], ask) -> list[tuple]:
    """The group's members: TPE's recipes (kept beside the group's state, so that a search
    stopped inside the group goes on with the same ones), or those kept when it was stopped."""
    kept = states / f"{members[0][0]}-members.json"
    if kept.is_file():
        return ask.again([tuple(m) for m in json.loads(kept.read_text(encoding="utf-8"))])
    members = ask(members)
    write_json(kept, [list(m) for m in members])
    return members


def submit(task, members: list[tuple], setting: Setting, threads: int, states: Path,
           start: int = 0, stop_at: int = 0):
    """Start a group's Ray task; returns its ref. With `start` or `stop_at` (search/rounds.py)
    its members go on from their states at step `start` and stop at `stop_at`, where each
    member's state is kept (`<trial>@<step>.pt` in `states`)."""
    def at(step: int) -> list[str] | None:
        return [str((states / f"{m[0]}@{step}.pt").resolve()) for m in members] if step else None

    saved = None if start or stop_at else str((states / f"{members[0][0]}-{members[-1][0]}.pt")
                                              .resolve())
    return task.remote(setting, [(m[2], m[3]) for m in members], threads, saved, at(start),
                       stop_at, at(stop_at), "+".join(m[0] for m in members))


def halves(error, members: list[tuple]) -> list[list[tuple]]:
    """A group the device ran out of memory for, as two groups to train instead (said in one
    line); any other error, or a group of one, is raised."""
    if "OutOfMemoryError" not in type(error.cause).__name__ or len(members) == 1:
        raise error
    half = len(members) // 2
    print(f"[wellfed] a group of {len(members)} fused trials ran out of device memory: "
          f"trained again as {half} + {len(members) - half}", flush=True)
    return [members[:half], members[half:]]


def trained(task, members: list[tuple], setting: Setting, threads: int, states: Path,
            start: int = 0, stop_at: int = 0) -> list[dict]:
    """A group's results from its Ray task (`submit`); a group the device runs out of memory
    for is trained again as two halves, down to one trial."""
    import ray

    ref = submit(task, members, setting, threads, states, start, stop_at)
    try:
        return ray.get(ref)
    except KeyboardInterrupt:
        ray.cancel(ref, force=True)
        raise
    except ray.exceptions.RayTaskError as error:
        return [got for part in halves(error, members)
                for got in trained(task, part, setting, threads, states, start, stop_at)]
