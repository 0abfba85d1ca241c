"""Telemetry overhead: wellfed's real training step with its step meter + device sampler on versus
off, same rows, same model, same number of steps, interleaved ON OFF OFF ON in one run.

"On" is what every worker does: StepMeter around fetch/copy/compute, the background
DeviceSampler thread (NVML on GPUs, process CPU figures here), and a meter/sampler snapshot every
10 steps (the report interval). "Off" swaps in a meter whose hooks do nothing and no sampler.
Target: throughput with telemetry >= 98% of without (overhead <= 2%).

usage: python benchmarks/telemetry_overhead.py
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path

import harness

NAME = "telemetry_overhead"
ROWS, BATCH, STEPS, REPORT_EVERY = 2048, 32, 48, 10
ORDER = ("on", "off", "off", "on")


class NullMeter:
    """The StepMeter interface with no work behind it."""

    def waiting(self):
        return contextlib.nullcontext()

    copying = computing = waiting

    def count(self, *args) -> None:
        pass


def main() -> None:
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from wellfed.config import TrainConfig
    from wellfed.data.batching import iterate_steps
    from wellfed.data.token_files import TokenFile, write_token_file
    from wellfed.data.tokenization import SplitTokenizer
    from wellfed.telemetry.gpu import DeviceSampler
    from wellfed.telemetry.meter import StepMeter
    from wellfed.telemetry.peak import device_peak
    from wellfed.train.step.feeding import micro_batches
    from wellfed.train.step.setup import setup
    from wellfed.train.step.step import train_step

    harness.require_sst2(NAME)
    torch.set_num_threads(harness.THREADS)
    hf_logging.set_verbosity_error()
    texts, labels = harness.read_sst2("train")
    pick = np.random.default_rng(42).choice(len(texts), ROWS, replace=False)
    tokenizer = AutoTokenizer.from_pretrained(harness.model_path())
    cpu = torch.device("cpu")
    # max_steps: the schedule (warmup 3 of STEPS) as before; pad multiple 1, pools of 64 batches
    cfg = TrainConfig(global_batch_size=BATCH, micro_batch_size=BATCH, max_steps=STEPS,
                      warmup_ratio=3 / STEPS, seed=42, precision="auto")
    results = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        frame = pd.DataFrame({"row_id": np.arange(ROWS), "text": [texts[i] for i in pick],
                              "label": labels[pick]})
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), f"{tmp}/train.parquet")
        path = Path(tmp) / "train.arrow"
        write_token_file(path, SplitTokenizer(tokenizer, 128, 8192).batches(f"{tmp}/train.parquet", "bench"))
        data = TokenFile(path)
        for mode in ORDER:
            torch.manual_seed(42)
            model = AutoModelForSequenceClassification.from_pretrained(harness.model_path(),
                                                                       num_labels=2)
            s = setup(cfg, model, len(data), cpu)
            steps = iterate_steps(data.lengths, s.spec, 0)
            fed = micro_batches(steps, data, path, 0, s.spec, 0, 2, False)
            sampler = DeviceSampler(cpu).start() if mode == "on" else None
            meter = (StepMeter(cpu, device_peak(cpu, "cpu", "fp32", None), model.config)
                     if mode == "on" else NullMeter())
            started, tokens = None, 0
            for i, (step, batches) in enumerate(fed):
                if i == STEPS:
                    break
                train_step(s, step, batches, meter, data.lengths)
                if mode == "on" and (i + 1) % REPORT_EVERY == 0:
                    meter.interval(), sampler.snapshot()
                    meter.reset()
                if i == 0:
                    started = time.perf_counter()  # the first step warms up: not timed
                else:
                    tokens += step.real_tokens
            seconds = time.perf_counter() - started
            if sampler:
                sampler.stop()
            results[mode].append({"real_tokens_per_s": round(tokens / seconds, 1),
                                  "seconds": round(seconds, 3), "timed_steps": STEPS - 1})
            print(f"[bench] telemetry {mode}: {tokens / seconds:.1f} real tokens/s")
    on = sum(r["real_tokens_per_s"] for r in results["on"]) / len(results["on"])
    off = sum(r["real_tokens_per_s"] for r in results["off"]) / len(results["off"])
    overhead = 1 - on / off
    harness.write_result(NAME, {
        "what": "training throughput with wellfed's telemetry on vs off (same step, rows, model)",
        "config": {"rows": ROWS, "batch": BATCH, "steps": STEPS, "report_every": REPORT_EVERY,
                   "order": list(ORDER), "precision": s.precision.name, "threads": harness.THREADS},
        "machine": harness.machine(),
        "contenders": results,
        "ratios": {"telemetry_on_vs_off": {
            "value": round(on / off, 4), "target": 0.98, "comparison": ">=",
            "met": on / off >= 0.98, "overhead_pct": round(100 * overhead, 2)}}})


if __name__ == "__main__":
    main()
