import pytest
import torch

from tests.conftest import CountedClock
from wellfed.config import ModelConfig
from wellfed.model import load_model
from wellfed.telemetry.diagnosis import (RunFigures, console, diagnose, figures_from_history,
                                         report)
from wellfed.telemetry.meter import StepMeter
from wellfed.telemetry.peak import Peak

STEP_S = 0.05
"""What each step of the tiny model stands for on the meter's clock: the verdicts below come
from the seconds the test says, not from how busy the machine was (under load a real 0.25 s
sleep measured as a 0.174 share, not > 0.3)."""


def measured_run(tiny_model_dir, loader_delay_s: float, steps: int = 6) -> RunFigures:
    """A real (tiny) training loop through the StepMeter, with a loader slowed on purpose: on a
    CountedClock that the loader advances by `loader_delay_s` per batch and the step by
    STEP_S, so the meter's shares are the planned ones exactly."""
    torch.manual_seed(0)
    model = load_model(ModelConfig(init="random"), str(tiny_model_dir), ["a", "b"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    clock = CountedClock()
    meter = StepMeter(torch.device("cpu"), Peak(1e12, "test"), model.config, clock=clock)

    def loader():
        while True:
            clock.advance(loader_delay_s)
            yield torch.randint(1000, 2000, (16, 48))

    batches = loader()
    for _ in range(steps):
        with meter.waiting():
            ids = next(batches)
        with meter.computing():
            loss = model(input_ids=ids, labels=torch.zeros(16, dtype=torch.long)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            clock.advance(STEP_S)
        meter.count(16, ids.numel(), ids.numel())
    fig = meter.interval()
    return RunFigures(input_wait_share=fig["input_wait_share"], padding_efficiency=1.0,
                      mfu=fig["mfu"], samples_per_s=fig["local_rows"] / fig["interval_s"],
                      loader_workers=0, micro_batch_size=16)


def test_a_slowed_loader_is_diagnosed_as_input_bound(tiny_model_dir):
    slow = measured_run(tiny_model_dir, loader_delay_s=0.25)
    code, finding, knob = diagnose(slow)
    assert slow.input_wait_share == pytest.approx(0.25 / (0.25 + STEP_S))
    assert code == "input" and slow.samples_per_s == pytest.approx(16 / (0.25 + STEP_S))
    assert "raise data.loader_workers from 0 to 2" in knob and "input-bound" in finding


def test_a_normal_cpu_run_is_not_called_input_bound(tiny_model_dir):
    normal = measured_run(tiny_model_dir, loader_delay_s=0.0)
    code, finding, _ = diagnose(normal)
    assert code == "compute" and normal.input_wait_share == 0.0 and normal.mfu > 0
    assert "compute-bound on CPU" in finding


def test_rules_on_recorded_gpu_histories():
    base = {"workers/input_wait_share_mean": [0.01, 0.02],
            "workers/padding_efficiency": [0.97, 0.98],
            "workers/mfu_mean": [0.31, 0.33], "workers/samples_per_s": [900, 950],
            "worker0/input_wait_share": [0.01, 0.02], "worker1/input_wait_share": [0.01, 0.02],
            "worker0/gpu_mem_total_gb": [80, 80], "worker1/gpu_mem_total_gb": [80, 80]}
    cases = {"launch": {"worker0/gpu_util_pct": [35, 40], "worker1/gpu_util_pct": [38, 42],
                        "worker0/gpu_mem_used_gb": [70, 70], "worker1/gpu_mem_used_gb": [70, 70]},
             "memory": {"worker0/gpu_util_pct": [97, 99], "worker1/gpu_util_pct": [97, 99],
                        "worker0/gpu_mem_used_gb": [12, 12], "worker1/gpu_mem_used_gb": [14, 14]},
             "compute": {"worker0/gpu_util_pct": [97, 99], "worker1/gpu_util_pct": [97, 99],
                         "worker0/gpu_mem_used_gb": [60, 61], "worker1/gpu_mem_used_gb": [60, 62]}}
    seen = 0
    for expected, extra in cases.items():
        figures = figures_from_history({**base, **extra}, loader_workers=2, micro_batch_size=32)
        assert diagnose(figures)[0] == expected
        seen += 1
    assert seen == 3
    padded = figures_from_history({**base, "workers/padding_efficiency": [0.6, 0.62]}, 0, 32)
    assert diagnose(padded)[0] == "padding"
    text, metrics = report(figures)
    assert "Bottleneck: compute-bound on GPU" in text and "| device utilisation | 98% |" in text
    assert metrics["input_bound"] == 0.0 and abs(metrics["mfu"] - 0.32) < 1e-9


def test_one_worker_is_read_from_the_means():
    """A single-worker run logs no worker0/* keys: its figures are the workers/*_mean curves."""
    history = {"workers/input_wait_share_mean": [0.01], "workers/padding_efficiency": [0.97],
               "workers/mfu_mean": [0.3], "workers/samples_per_s": [900],
               "workers/gpu_util_pct_mean": [35, 45], "workers/gpu_mem_used_gb_mean": [70],
               "workers/gpu_mem_total_gb_mean": [80]}
    figures = figures_from_history(history, loader_workers=0, micro_batch_size=32)
    assert figures.device_util_pct == 40 and figures.memory_used_share == 70 / 80
    assert diagnose(figures)[0] == "launch" and figures.per_worker_wait == {}
    assert "| input wait (share of step time) | 1.0% |" in report(figures)[0]


def test_the_console_gets_sentences_with_the_same_figures_and_no_markdown():
    figures = RunFigures(input_wait_share=0.34, padding_efficiency=0.97, mfu=0.2,
                         samples_per_s=120.0, loader_workers=0, micro_batch_size=32,
                         per_worker_wait={0: 0.3, 1: 0.38})
    lines = console(figures)
    assert lines[0] == ("bottleneck: input-bound 34% of step time. Knob: raise "
                        "data.loader_workers from 0 to 2 (and data.prefetch), or move the token "
                        "files to local disk.")
    assert lines[1].startswith("diagnosis: input wait (share of step time) 34.0% (worker0 30.0%, "
                               "worker1 38.0%), padding waste 3.0%, MFU (useful tokens) 20.0%")
    assert len(lines) == 2 and not any(mark in "".join(lines) for mark in ("**", "|", "#"))
    markdown = report(figures)[0]  # the file keeps its table, with the same values
    assert markdown.startswith("# wellfed diagnosis\n\n**Bottleneck: input-bound 34%")
    assert "| input wait (share of step time) | 34.0% (worker0 30.0%, worker1 38.0%) |" in markdown


def test_a_cpu_run_starved_by_other_processes_is_called_shared_not_compute_bound():
    """The process's own CPU use (`workers/cpu_util_pct_mean`, 100 = one CPU): under half of
    the CPUs it asked for, the machine was shared and no knob of the run's is the answer."""
    base = {"workers/input_wait_share_mean": [0.001], "workers/padding_efficiency": [0.99],
            "workers/mfu_mean": [0.08], "workers/samples_per_s": [22.8]}
    starved = figures_from_history({**base, "workers/cpu_util_pct_mean": [38.0, 42.0]}, 0, 32,
                                   cpus=2)
    code, finding, knob = diagnose(starved)
    assert code == "shared" and finding == ("the machine was shared: this process got 0.4 of "
                                            "the 2 CPUs it asked for, other processes had the rest")
    assert "rerun on a quiet machine" in knob and "more or faster devices" not in knob
    text, metrics = report(starved)
    assert "| CPU use (this process) | 0.4 of 2 CPUs |" in text and metrics["shared"] == 1.0
    busy = figures_from_history({**base, "workers/cpu_util_pct_mean": [188.0, 192.0]}, 0, 32,
                                cpus=2)
    assert diagnose(busy)[0] == "compute" and report(busy)[1]["shared"] == 0.0
    one = figures_from_history({**base, "workers/cpu_util_pct_mean": [60.0]}, 0, 32, cpus=1)
    assert diagnose(one)[0] == "compute"  # 0.6 of its 1 CPU: more than half
    gpu = figures_from_history({**base, "workers/cpu_util_pct_mean": [10.0],
                                "workers/gpu_util_pct_mean": [97.0]}, 0, 32, cpus=2)
    assert gpu.cpu_util_pct is None and diagnose(gpu)[0] == "compute"
