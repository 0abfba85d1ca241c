"""What a GPU's first use costs a fresh process, part by part: the issue measured a first
`train()` in a process ~12 s slower than the second, on an H100, and the GPU benchmarks hide
that behind an untimed warm-up. This one hides nothing: every figure counts from process start.

One child process per variant (default CUDA_MODULE_LOADING, then EAGER), each timing:
  import torch; the CUDA context (first allocation); cuBLAS (first bf16 matmul, its handle,
  workspace and kernel); SDPA (first scaled_dot_product_attention); then wellfed's own loop
  (`train.loop.train`, the planned path with CUDA graphs, bf16) twice on the same job:
  BERT-base-sized weights, the first ROWS SST-2 train rows, batch 32, validation at the
  end. Per run: wall, the loop's parts (setup = model load and copy, steps, validation...),
  ms per step in each 10-step report interval (the first interval holds every shape's eager
  warm-up and capture), CUDA graph capture seconds, and reserved memory. run 1 - run 2 is what
  the first use costs; `--profile` adds torch.profiler's top operators of run 1's first 20
  steps (the slow first launches show as cudaLaunchKernel / cuModuleLoad time).
The weights are a random-init BERT-base encoder the parent saves before any child starts
(gpu_throughput.save_encoder), which each train() loads as a train stage loads a pretrained
model: until 2026-11-28 each train() random-initialised every weight on the CPU instead (the
loop's `setup` part held it), and the child's `data + job` mark also held its imports of
transformers and wellfed's loop, now a mark of their own.

writes benchmarks/results/gpu/gpu_first_use.json (device named). WELLFED_BENCH_SMOKE=1 runs it
tiny on a CPU (a check of this script, no figures). Needs torch, transformers and the SST-2
folder only (no ray, mlflow or dvc): on a lent GPU,
  PYTHONPATH=src python benchmarks/gpu_first_use.py [ROWS] [--profile]     (default 4096 rows)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

NAME = "gpu_first_use"
SMOKE = os.environ.get("WELLFED_BENCH_SMOKE") == "1"
VARIANTS = {"lazy (default)": {}, "eager module loading": {"CUDA_MODULE_LOADING": "EAGER"}}


def probe(rows: int, profile: bool) -> dict:
    """This process's first uses, in order, each from process start."""
    from wellfed.telemetry.budget import process_started

    started = process_started() or time.time()
    marks = {"interpreter + harness": time.time() - started}

    def mark(name, fn=None):
        t = time.perf_counter()
        out = fn() if fn else None
        marks[name] = round(time.perf_counter() - t, 3)
        return out

    torch = mark("import torch", lambda: __import__("torch"))
    cuda = torch.cuda.is_available() and not SMOKE
    device = torch.device("cuda" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    mark("cuda context", lambda: (torch.empty(1, device=device), sync()))
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(1024, 1024, device=device, dtype=dtype)
    mark("first matmul (cuBLAS)", lambda: ((a @ a), sync()))
    q = torch.randn(32, 12, 64, 64, device=device, dtype=dtype)
    mark("first attention (SDPA)", lambda: (
        torch.nn.functional.scaled_dot_product_attention(q, q, q), sync()))
    mark("import transformers, wellfed.train.step.loop",
         lambda: (__import__("transformers").AutoTokenizer, __import__("wellfed.train.step.loop")))
    job = mark("data + job", lambda: make_job(rows, Path(tempfile.mkdtemp())))
    runs = [train_once(job, device, profile and n == 0) for n in range(2)]
    return {"marks_s": marks, "runs": runs, "first_minus_second_s": round(
        runs[0]["wall_s"] - runs[1]["wall_s"], 2), "since_process_start_s": round(
        time.time() - started, 2), "device": device_name(device)}


def device_name(device) -> str:
    from wellfed import device as dev

    return dev.device_name(device)


def make_job(rows: int, tmp: Path):
    """Token files of the first `rows` SST-2 train rows (validation: the next 872) and the
    parent's saved weights (WELLFED_FIRST_USE_MODEL)."""
    import numpy as np
    from transformers import AutoTokenizer

    from wellfed.config import DataConfig, ModelConfig, TrainConfig
    from wellfed.data.token_files import TokenBatch, write_token_file
    from wellfed.train.step.loop import TrainJob

    texts, labels = harness.read_sst2("train")
    rows = 64 if SMOKE else rows
    tokenizer = AutoTokenizer.from_pretrained(harness.model_path())
    for split, (lo, hi) in (("train", (0, rows)), ("validation", (rows, rows + (32 if SMOKE
                                                                                 else 872)))):
        ids = tokenizer(texts[lo:hi], truncation=True, max_length=128)["input_ids"]
        write_token_file(tmp / f"{split}.arrow", [TokenBatch(
            np.concatenate([np.asarray(i, np.int32) for i in ids]),
            np.array([len(i) for i in ids], np.int32), labels[lo:hi], np.arange(hi - lo))])
    model_dir = os.environ["WELLFED_FIRST_USE_MODEL"]
    train = TrainConfig(epochs=1, global_batch_size=32, micro_batch_size=32, eval_every=0,
                        report_every=10, checkpoint_every=0, lr=1e-4)
    return TrainJob(train=train, data=DataConfig(), model=ModelConfig(name=model_dir),
                    tokens_dir=tmp, model_source=model_dir, labels=("negative", "positive"),
                    pad_id=tokenizer.pad_token_id)


def train_once(job, device, profile: bool) -> dict:
    """One `train()` of `job`: wall, the loop's parts, ms/step per report interval."""
    import torch

    from wellfed.train.step.loop import Place, train

    stamps, timing = [], {}

    def report(metrics: dict, directory) -> None:
        stamps.append((time.perf_counter(), metrics["records"][-1]["step"]))
        timing.update(metrics.get("timing", {}))

    context = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []),
        schedule=torch.profiler.schedule(wait=0, warmup=0, active=20, repeat=1)) \
        if profile else None
    start = time.perf_counter()
    if context is None:
        state = train(job, Place(device), report)
    else:
        with context:
            state = train(job, Place(device), report)
    wall = time.perf_counter() - start
    intervals, last = [], (start, 0)
    for t, step in stamps:
        intervals.append(round(1000 * (t - last[0]) / max(step - last[1], 1), 2))
        last = (t, step)
    out = {"wall_s": round(wall, 2), "steps": state.step, "loop_parts_s": {
        k: round(v, 2) for k, v in timing.items()}, "ms_per_step_by_interval": intervals}
    if device.type == "cuda":
        out["reserved_gb"] = round(torch.cuda.memory_reserved() / 2**30, 2)
    if context is not None:
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        out["profile_top_ops"] = context.key_averages().table(sort_by=sort, row_limit=25)
    return out


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rows, profile = int(args[0]) if args else 4096, "--profile" in sys.argv
    if os.environ.get("WELLFED_FIRST_USE_CHILD"):
        print(json.dumps(probe(rows, profile)))
        return
    harness.require_sst2(NAME)
    import gpu_throughput as gt

    model = gt.save_encoder("tiny" if SMOKE else "bert_base", Path(tempfile.mkdtemp()), seed=0)
    results = {}
    for name, extra in VARIANTS.items():
        proc = subprocess.run([sys.executable, __file__, *sys.argv[1:]], capture_output=True,
                              text=True, env={**os.environ, **extra, "WELLFED_FIRST_USE_CHILD": "1",
                                              "WELLFED_FIRST_USE_MODEL": str(model)})
        if proc.returncode:
            raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"[bench] {NAME} {name}: run 1 {results[name]['runs'][0]['wall_s']} s, run 2 "
              f"{results[name]['runs'][1]['wall_s']} s", flush=True)
    folder = Path(tempfile.mkdtemp()) if SMOKE else harness.RESULTS / "gpu"
    harness.write_result(NAME, {
        "what": "a GPU's first use in a fresh process: probes from process start, then the "
                "same train() twice; run 1 - run 2 is the first use's cost; each train() loads "
                "saved random-init BERT-base weights, as a train stage loads a pretrained model",
        "device": next(iter(results.values()))["device"], "rows": rows, "variants": results,
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": harness.machine()}, folder=folder)


if __name__ == "__main__":
    main()
