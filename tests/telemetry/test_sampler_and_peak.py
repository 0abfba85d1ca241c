import time

import pytest
import torch

from tests.conftest import CountedClock
from wellfed.telemetry import gpu
from wellfed.telemetry.peak import device_peak, table_peak
from wellfed.track import worker_metrics


def test_peak_table_and_measurement(tmp_path, monkeypatch):
    monkeypatch.setenv("WELLFED_CACHE", str(tmp_path))  # a first run here: no best kept yet
    assert table_peak("NVIDIA H100 80GB HBM3", "bf16").flops == 989e12
    assert table_peak("NVIDIA H100 PCIe", "bf16").source == "table:H100 PCIe bf16"
    assert table_peak("Tesla T4", "bf16") is None  # T4 has no bf16: measure instead
    cpu = device_peak(torch.device("cpu"), "x86_64", "fp32", None)
    assert cpu.flops > 1e8 and cpu.source.startswith("estimate:best of 5 2048x2048 float32 matmuls on cpu")
    again = device_peak(torch.device("cpu"), "x86_64", "fp32", None)  # one product, kept best
    assert again.flops >= cpu.flops and again.source.startswith(cpu.source)


def test_a_cpu_peak_keeps_the_best_measurement_seen_on_the_machine(tmp_path, monkeypatch):
    """A measurement under load (0.5e11) after a quiet one (2e11) does not lower the peak; a
    later, faster one (3e11) raises it for every run after."""
    from wellfed.telemetry import peak as peaks

    readings, repeats = iter([2e11, 0.5e11, 3e11, 1e11]), []

    def measure(device, dtype, repeats_=5, **kw):
        repeats.append(kw.get("repeats", repeats_))
        return peaks.Peak(next(readings), "estimate:x")

    monkeypatch.setattr(peaks, "measure_peak", measure)
    got = [peaks.cached_peak(torch.device("cpu"), "cpu", None, cache=tmp_path) for _ in range(4)]
    assert [p.flops for p in got] == [2e11, 2e11, 3e11, 3e11]
    assert repeats == [5, 1, 1, 1]  # best of 5 on a first run; one product once a best is kept
    assert got[1].source == "estimate:x (best on this machine)" and got[2].source == "estimate:x"
    assert len(list(tmp_path.glob("peak-*.json"))) == 1


def test_mfu_never_exceeds_one_when_the_peak_was_measured_too_low():
    """A peak measured under load (planted here: 1 GFLOP/s) below what training then achieves:
    the meter raises the estimate to the achieved rate instead of reporting MFU > 1."""
    from transformers import BertConfig

    from wellfed.telemetry.meter import StepMeter
    from wellfed.telemetry.peak import Peak

    config = BertConfig(hidden_size=64, num_hidden_layers=2, intermediate_size=128)
    clock = CountedClock()
    meter = StepMeter(torch.device("cpu"), Peak(1e9, "estimate:planted slow matmul"), config,
                      clock=clock)
    clock.advance(0.5)  # half a second of "training" on 4,096 real of 4,608 computed tokens
    meter.count(128, 4096, 4608)
    figures = meter.interval()
    assert 0 < figures["mfu"] <= 1.0
    assert figures["mfu"] == pytest.approx(4096 / 4608, rel=1e-6)  # useful share of achieved
    assert meter.peak.flops > 1e9 and "raised to" in meter.peak.source
    table = StepMeter(torch.device("cpu"), Peak(1e9, "table:planted"), config, clock=clock)
    clock.advance(0.5)
    table.count(128, 4096, 4608)
    assert table.interval()["mfu"] == 1.0 and table.peak.flops == 1e9  # capped, table kept


def test_cpu_sampler_records_cpu_figures():
    """Not started, the sampler reads once at the snapshot, over all the work since it was made:
    0.2 s of this process's own CPU time (counted, not a wall-clock deadline, which on a loaded
    machine may pass before the process ran at all)."""
    sampler = gpu.DeviceSampler(torch.device("cpu"))
    x = torch.randn(300, 300)
    start = time.process_time()
    while time.process_time() - start < 0.2:
        x @ x
    snap = sampler.snapshot()
    assert sampler.kind == "cpu" and set(snap) == {"cpu_util_pct", "cpu_rss_gb"}
    assert snap["cpu_util_pct"] > 0 and snap["cpu_rss_gb"] > 0


def test_gpu_sampler_averages_nvml_samples(monkeypatch):
    samples = iter([{"gpu_util_pct": 50.0, "gpu_mem_used_gb": 10.0},
                    {"gpu_util_pct": 70.0, "gpu_mem_used_gb": 12.0}] + [{}] * 100)
    monkeypatch.setattr(gpu, "nvml_handle", lambda device: "handle")
    monkeypatch.setattr(gpu, "read_nvml", lambda handle: next(samples))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 2**30)
    sampler = gpu.DeviceSampler(torch.device("cuda", 0), interval_s=0.01)
    for _ in range(2):
        sampler._sums.update({k: sampler._sums.get(k, 0) + v for k, v in sampler.read().items()})
        sampler._count += 1
    snap = sampler.snapshot()
    assert sampler.kind == "gpu"
    assert snap == {"gpu_util_pct": 60.0, "gpu_mem_used_gb": 11.0, "torch_max_allocated_gb": 3.0}


def test_nvml_failure_falls_back_to_cpu_once(monkeypatch, caplog):
    def broken(device):
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setattr(gpu, "nvml_handle", broken)
    sampler = gpu.DeviceSampler(torch.device("cuda", 0))
    assert sampler.kind == "cpu" and "cpu_util_pct" in sampler.read()
    assert sum("GPU telemetry off" in r.message for r in caplog.records) == 1


def interval_reports(ranks: tuple[int, ...]) -> list[dict]:
    records = [{"step": s, "rows": 32, "real_tokens": 300, "padded_tokens": 320} for s in (1, 2)]
    return [{"rank": r, "records": records, "interval_s": 2.0, "input_wait_s": 0.1 * (r + 1),
             "copy_s": 0.0, "compute_s": 1.8, "local_rows": 32, "local_real_tokens": 300,
             "mfu": 0.2 + 0.1 * r, "telemetry": {"gpu_util_pct": 80.0 + 10 * r},
             "timing": {"steps": 3.0}} for r in ranks]


def test_interval_metrics_key_every_worker_and_aggregate():
    out = worker_metrics.interval_metrics(interval_reports((0, 1)))
    assert out["workers/samples_per_s"] == 32.0 and out["workers/padding_efficiency"] == 600 / 640
    assert out["worker0/input_wait_share"] == 0.05 and out["worker1/input_wait_share"] == 0.1
    assert out["worker1/gpu_util_pct"] == 90.0
    assert out["workers/gpu_util_pct_min"] == 80.0 and out["workers/gpu_util_pct_max"] == 90.0
    assert abs(out["workers/mfu_mean"] - 0.25) < 1e-12


def test_one_worker_logs_means_only_and_sorts_after_the_headline():
    out = worker_metrics.interval_metrics(interval_reports((0,)))
    assert sorted(out) == ["workers/compute_share_mean", "workers/copy_share_mean",
                           "workers/gpu_util_pct_mean", "workers/input_wait_share_mean",
                           "workers/mfu_mean", "workers/padding_efficiency",
                           "workers/real_tokens_per_s", "workers/samples_per_s"]
    assert all(key > "val/" for key in out)  # the UI lists and charts keys alphabetically
    assert set(worker_metrics.PERF_CURVE) <= set(out)
    assert "steps" in worker_metrics.worker_time_tag(interval_reports((0,)))[worker_metrics.WORKER_TIME]


def test_measuring_the_peak_leaves_the_global_random_stream_alone():
    """Training seeds dropout from the global generator; the peak measurement runs after the
    seed, so it must draw from its own."""
    import torch

    from wellfed.telemetry.peak import measure_peak

    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    measure_peak(torch.device("cpu"), None, size=64, repeats=1)
    assert torch.equal(torch.rand(3), expected)
