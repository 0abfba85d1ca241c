"""End-of-run diagnosis: how busy was each device, and if not busy, why, and which knob to turn.

Input is the run's MLflow metric histories (every worker's figures, logged by the driver-side
callback); output is a short markdown report plus its figures. The rules run in order
of how much time they explain; the first that fires names the bottleneck.
"""

from __future__ import annotations

from dataclasses import dataclass, field

INPUT_BOUND = 0.10  # >10% of step time blocked on the next batch
PADDING_WASTE = 0.15  # >15% of computed tokens are padding
LOW_UTIL = 60.0  # GPU busy <60% of the time while not input-bound
HEADROOM = 0.5  # >50% of GPU memory unused
SHARED = 0.5  # a CPU run whose process got under half the CPUs it asked for: other processes had them


@dataclass
class RunFigures:
    """Run-level means of the interval figures (what the rules look at)."""

    input_wait_share: float
    padding_efficiency: float
    mfu: float
    samples_per_s: float
    loader_workers: int
    micro_batch_size: int
    real_tokens_per_s: float = 0.0
    device_util_pct: float | None = None
    memory_used_share: float | None = None
    per_worker_wait: dict[int, float] = field(default_factory=dict)
    cpu_util_pct: float | None = None
    """A CPU run's process CPU use (100 = one CPU busy), mean over workers; None on GPUs."""
    cpus: int = 1
    """The CPUs each worker asked for (ray.cpus_per_worker: its torch threads)."""


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def figures_from_history(history: dict[str, list[float]], loader_workers: int,
                         micro_batch_size: int, cpus: int = 1) -> RunFigures:
    """history: metric key -> values over the run's report intervals (worker_metrics.interval_metrics:
    `workers/*`, and `worker<rank>/*` when there was more than one worker); `cpus`: each
    worker's ray.cpus_per_worker."""
    cpu = history.get("workers/cpu_util_pct_mean", [])
    workers = sorted({int(k.split("/")[0].removeprefix("worker")) for k in history
                      if k.split("/")[0].removeprefix("worker").isdigit()})

    def each(key: str) -> list[list[float]]:
        """Every worker's values of one figure; one worker's are the workers/*_mean curve."""
        names = [f"worker{w}/{key}" for w in workers] if workers else [f"workers/{key}_mean"]
        return [history[name] for name in names if name in history]

    util = [mean(values) for values in each("gpu_util_pct")]
    used, total = each("gpu_mem_used_gb"), each("gpu_mem_total_gb")
    used = [mean(u) / mean(t) for u, t in zip(used, total)] if len(used) == len(total) else []
    return RunFigures(
        input_wait_share=mean(history.get("workers/input_wait_share_mean", [])),
        padding_efficiency=mean(history.get("workers/padding_efficiency", [])) or 1.0,
        mfu=mean(history.get("workers/mfu_mean", [])),
        samples_per_s=mean(history.get("workers/samples_per_s", [])),
        real_tokens_per_s=mean(history.get("workers/real_tokens_per_s", [])),
        loader_workers=loader_workers, micro_batch_size=micro_batch_size,
        device_util_pct=mean(util) if util else None,
        memory_used_share=max(used) if used else None,
        per_worker_wait={w: mean(history.get(f"worker{w}/input_wait_share", [])) for w in workers},
        cpu_util_pct=mean(cpu) if cpu and not util else None, cpus=cpus)


def shared(f: RunFigures) -> bool:
    """A CPU run whose process got under SHARED of the CPUs it asked for: the machine was busy
    with other work, so every speed figure measures the contention more than the run (this
    machine's issue: `make run` beside other jobs got 0.4 of 2 CPUs and was called
    compute-bound, with "add devices" as its knob)."""
    return f.cpu_util_pct is not None and f.cpu_util_pct < SHARED * 100 * f.cpus


def diagnose(f: RunFigures) -> tuple[str, str, str]:
    """(bottleneck code, one-line finding, knob to turn)."""
    if shared(f):
        return ("shared", f"the machine was shared: this process got "
                f"{f.cpu_util_pct / 100:.1f} of the {f.cpus} CPU{'s' if f.cpus > 1 else ''} it "
                "asked for, other processes had the rest",
                "none to turn yet: rerun on a quiet machine (or with ray.cpus_per_worker set to "
                "the CPUs it can have) before reading the speed figures below")
    if f.input_wait_share >= INPUT_BOUND:
        target = max(2, 2 * f.loader_workers)
        return ("input", f"input-bound {f.input_wait_share:.0%} of step time",
                f"raise data.loader_workers from {f.loader_workers} to {target} "
                "(and data.prefetch), or move the token files to local disk")
    if 1 - f.padding_efficiency >= PADDING_WASTE:
        return ("padding", f"padding waste {1 - f.padding_efficiency:.0%} of computed tokens",
                "set train.micro_batch_tokens (a token budget) or raise train.pool_batches")
    if f.device_util_pct is not None and f.device_util_pct < LOW_UTIL:
        return ("launch", f"device busy only {f.device_util_pct:.0f}% of the time while the "
                "input side keeps up", f"raise train.micro_batch_size from {f.micro_batch_size} "
                "(fewer, larger kernels)")
    if f.memory_used_share is not None and f.memory_used_share < 1 - HEADROOM:
        return ("memory", f"{1 - f.memory_used_share:.0%} of device memory unused",
                f"raise train.micro_batch_size from {f.micro_batch_size} to use it")
    where = "CPU" if f.device_util_pct is None else "GPU"
    return ("compute", f"compute-bound on {where}: the input side keeps up "
            f"(input wait {f.input_wait_share:.1%}) and padding is low",
            "more or faster devices (ray.num_workers, a GPU), or bf16 where the device has it")


def table(f: RunFigures) -> list[tuple[str, str]]:
    """(figure, value) pairs of the diagnosis, in the order both forms show them."""
    util = "n/a (no GPU)" if f.device_util_pct is None else f"{f.device_util_pct:.0f}%"
    headroom = ("n/a (no GPU)" if f.memory_used_share is None
                else f"{1 - f.memory_used_share:.0%}")
    waits = ", ".join(f"worker{w} {v:.1%}" for w, v in f.per_worker_wait.items())
    waits = f" ({waits})" if waits else ""
    return [("input wait (share of step time)", f"{f.input_wait_share:.1%}{waits}"),
            ("padding waste", f"{1 - f.padding_efficiency:.1%}"),
            ("MFU (useful tokens)", f"{f.mfu:.1%}"),
            ("device utilisation", util), ("memory headroom", headroom),
            *([("CPU use (this process)", f"{f.cpu_util_pct / 100:.1f} of {f.cpus} CPUs")]
              if f.cpu_util_pct is not None else []),
            ("throughput", f"{f.samples_per_s:.1f} samples/s")]


def report(f: RunFigures) -> tuple[str, dict[str, float]]:
    """Markdown diagnosis and its figures (data/train/diagnosis.json)."""
    code, finding, knob = diagnose(f)
    rows = "".join(f"| {name} | {value} |\n" for name, value in table(f))
    text = (f"# wellfed diagnosis\n\n**Bottleneck: {finding}.** Knob: {knob}.\n\n"
            f"| figure | value |\n|---|---|\n{rows}")
    metrics = {"input_wait_share": f.input_wait_share, "padding_waste": 1 - f.padding_efficiency,
               "mfu": f.mfu, "samples_per_s": f.samples_per_s,
               "input_bound": float(code == "input")}
    if f.device_util_pct is not None:
        metrics["device_util_pct"] = f.device_util_pct
    if f.cpu_util_pct is not None:
        metrics.update(cpu_util_pct=f.cpu_util_pct, shared=float(code == "shared"))
    return text, metrics


def console(f: RunFigures) -> list[str]:
    """The diagnosis for a console, as plain sentences (the Markdown stays in diagnosis.md):
    the finding with its knob, then the figures."""
    _, finding, knob = diagnose(f)
    figures = ", ".join(f"{name} {value}" for name, value in table(f))
    return [f"bottleneck: {finding}. Knob: {knob}.", f"diagnosis: {figures}"]
