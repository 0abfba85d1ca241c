"""Every GPU busy (issue 29): graphs under a process group, fused kernels for big batches, a
GPU-filling batch and a shared GPU, measured on one lent GPU. Written without a GPU; its first
five cases ran on an H200 on 2026-11-28 (docs/gpu.md), shared_minilm and compiled_* not yet.

`python benchmarks/gpu_scale.py [CASE ...]` (default: every case, in this order):
  graphs_b256    BERT-base, global batch 256 (micro_batch_tokens 16,384), all 67,349 SST-2 train
                 rows: the planned step with CUDA graphs, one worker (target: warm >= 300,000
                 real tokens/s)
  graphs_b32     BERT-base, batch 32, 20,000 rows (target: warm >= 70,000)
  nccl_b256      graphs_b256 with a one-rank NCCL process group, as every Ray Train worker has:
  nccl_b32       the gradient all-reduce captured in the update graph (target: within 5% of
                 graphs_*)
  fill_32k       BERT-base, global batch 2,048 rows, micro_batch_tokens 32,768, lr 8e-4: a step
                 that fills the GPU (target: MFU >= 25%)
  shared_minilm  MiniLM-L6, batch 32, 20,000 rows: one process alone, then four at once (what
                 Ray places at ray.gpus_per_worker 0.25, without Ray), each timed over the same
                 10 s (target: total >= 2.5x alone)
  compiled_b256  graphs_b256 with the forward compiled per planned shape (train/step/fusion.py,
                 inductor max-autotune-no-cudagraphs), a cold cache then the same cache in a new
                 process (targets: warm >= 300,000; compile cost <= 60 s cold, <= 10 s warm)
  compiled_b32   the same at batch 32, if the deadline leaves room
Each run is a fresh process (benchmarks/gpu_fresh_run.py): `fresh` counts from process start
(imports, CUDA's first use, the model's weights loaded, warm-ups, captures, compiles), first;
`warm` is the same process once every shape is captured. The token files and the saved
random-init weights are made here, before a run's clock starts: the tokenize stage and a
pretrained checkpoint stand for them in a pipeline (until 2026-11-28 each run built its model
by a random init, which a train stage loading weights does not pay). Compile cost = a compiled
run's fresh time to its last fresh step minus the plain run's. The first five took 174 s.
Results: benchmarks/results/gpu/gpu_scale.json, rewritten after every case, naming the device.
WELLFED_BENCH_DEADLINE_S (default 470): a case starts only if its time limit fits in what is
left, and a run only with WELLFED_BENCH_LEAST_S (default 60) or more.
WELLFED_BENCH_COMPILE_MODE overrides the inductor mode. WELLFED_SST2_DIR and WELLFED_MODEL_DIR
as in harness.py. Needs torch, transformers, pyarrow, wellfed: no ray, mlflow or dvc.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness

NAME = "gpu_scale"
HERE = Path(__file__).resolve().parent
SMOKE = os.environ.get("WELLFED_BENCH_SMOKE") == "1"
DEADLINE = float(os.environ.get("WELLFED_BENCH_DEADLINE_S") or (600 if SMOKE else 470))
MODE = os.environ.get("WELLFED_BENCH_COMPILE_MODE") or "max-autotune-no-cudagraphs"
B256 = {"kind": "bert_base", "batch": 256, "tokens": 16_384, "lr": 3e-4, "rows": 0,
        "steps": 263, "warm": 300, "timed": 60}  # 263 steps: one epoch of SST-2 train
B32 = {"kind": "bert_base", "batch": 32, "tokens": 0, "lr": 1e-4, "rows": 20_000,
       "steps": 300, "warm": 400, "timed": 100}
MINILM = {"kind": "minilm", "batch": 32, "tokens": 0, "lr": 1e-4, "rows": 20_000,
          "steps": 300, "warm": 400, "seconds": 10.0}
# name: [(label, spec, copies, time limit in s, seconds kept for the next run: None = LEAST)]
CASES = {
    "graphs_b256": [("run", B256, 1, 120, 0)],
    "graphs_b32": [("run", B32, 1, 120, 0)],
    "nccl_b256": [("run", {**B256, "group": True}, 1, 120, 0)],
    "nccl_b32": [("run", {**B32, "group": True}, 1, 120, 0)],
    # 2,048 rows x 13.3 tokens (SST-2's mean) = ~27k real tokens a step; lr: 1e-4 at batch 32
    # scaled by sqrt(2048 / 32) = 8. 33 steps an epoch.
    "fill_32k": [("run", {"kind": "bert_base", "batch": 2048, "tokens": 32_768, "lr": 8e-4,
                          "rows": 0, "steps": 33, "warm": 40, "timed": 15}, 1, 150, 0)],
    # alone keeps LEAST for four (the least time a run starts with): each should take ~30-45 s,
    # by estimate from graphs_b32's 29 s run on the H200 (not yet measured)
    "shared_minilm": [("alone", MINILM, 1, 120, None), ("four", MINILM, 4, 180, 0)],
    # A cold compile may take longer than the deadline leaves: it gets what is left but the
    # warm run's 100 s, and a run cut short reports how far it got.
    "compiled_b256": [("cold", {**B256, "compile": True}, 1, 240, 100),
                      ("warm", {**B256, "compile": True}, 1, 120, 0)],
    "compiled_b32": [("cold", {**B32, "compile": True}, 1, 200, 80),
                     ("warm", {**B32, "compile": True}, 1, 100, 0)],
}
LEAST = float(os.environ.get("WELLFED_BENCH_LEAST_S") or 60)
"""A run given less time than this is not started (WELLFED_BENCH_LEAST_S: a short device call
may start a run with less, at the risk of its being cut short, which its result then says)."""
STARTED = time.perf_counter()


def spec_for(base: dict, arrow: Path, pad: int, scratch: Path, case: str) -> dict:
    spec = {"group": False, "compile": None, "timed": 0, "seconds": 0.0, "barrier": False,
            "seed": 1, **base, "arrow": str(arrow), "pad": pad, "smoke": SMOKE,
            "store": str(scratch / f"{case}.store")}
    if base.get("compile"):  # one cache root per benchmark run: the first run of it is cold
        spec["compile"] = {"root": str(scratch / "inductor"), "mode": MODE}
    if SMOKE:
        spec.update(kind="tiny", steps=3, warm=8, timed=3 if spec["timed"] else 0,
                    seconds=1.0 if spec["seconds"] else 0.0)
    spec["weights"] = str(weights(spec["kind"], scratch))
    return spec


def weights(kind: str, scratch: Path) -> Path:
    """`kind`'s random-init encoder, saved once per benchmark run (gpu_throughput.save_encoder):
    every run of it loads these weights as a train stage loads a pretrained model."""
    import gpu_throughput as gt

    folder = scratch / f"weights_{kind}"
    if not (folder / "config.json").exists():
        gt.save_encoder(kind, folder, seed=0)
    return folder


class Child:
    """One gpu_fresh_run.py process: its stdout read by a thread into a line queue, its stderr
    written to a file."""

    def __init__(self, spec: dict, log: Path):
        env = {**os.environ, "WELLFED_BENCH_T0": repr(time.time())}
        self.log = open(log, "w")  # noqa: SIM115 - the child writes its stderr there until it ends
        self.proc = subprocess.Popen([sys.executable, str(HERE / "gpu_fresh_run.py"),
                                      json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.lines: queue.Queue = queue.Queue()
        self.progress: dict = {}
        threading.Thread(target=self.read, daemon=True).start()

    def read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, prefix: str, until: float) -> str | None:
        while True:
            try:
                line = self.lines.get(timeout=max(until - time.time(), 0.01))
            except queue.Empty:
                return None
            if line is not None and line.startswith("[progress] "):
                self.progress = json.loads(line[len("[progress] "):])
            if line is None or line.startswith(prefix):
                return line

    def finish(self, until: float, log: Path) -> dict:
        line = self.wait_for("[result] ", until)
        timed_out = line is None and self.proc.poll() is None
        if timed_out:
            self.proc.kill()
        self.proc.wait()
        self.log.close()
        if timed_out:
            return {"timed_out": True, "last_progress": self.progress,
                    "stderr_tail": log.read_text(errors="replace")[-1500:]}
        if line is None:
            tail = log.read_text(errors="replace")[-1500:]
            return {"error": f"exit {self.proc.returncode}", "stderr_tail": tail}
        return json.loads(line[len("[result] "):])


def run_copies(spec: dict, copies: int, limit: float, scratch: Path, tag: str) -> list[dict]:
    """`copies` processes of `spec` at once; with several, each waits at its timed window
    until all are there, so the figures share one window."""
    spec = {**spec, "barrier": copies > 1}
    logs = [scratch / f"{tag}.{i}.log" for i in range(copies)]
    children = [Child(spec, log) for log in logs]
    until = time.time() + limit
    if copies > 1:
        ready = [c.wait_for("[ready]", until) for c in children]
        for child in children:
            if child.proc.poll() is None:
                child.proc.stdin.write("\n")
                child.proc.stdin.flush()
        if any(r is None for r in ready):
            print(f"[bench] {tag}: not every copy reached its timed window", flush=True)
    return [c.finish(until, log) for c, log in zip(children, logs)]


def ratios(cases: dict) -> list[dict]:
    """Each target the issue set, from the cases measured so far."""
    def warm(case, label="run", i=0):
        runs = cases.get(case, {}).get(label) or [{}]
        return runs[i].get("warm", {}).get("real_tokens_per_s")

    def fresh_done(case, label="run"):
        runs = cases.get(case, {}).get(label) or [{}]
        return runs[0].get("fresh", {}).get("done_s")

    out = []
    for case, target in (("graphs_b256", 300_000), ("graphs_b32", 70_000),
                         ("compiled_b256", 300_000), ("compiled_b32", 70_000)):
        value = warm(case, "warm" if case.startswith("compiled") else "run")
        if value:
            out.append({"case": case, **harness.ratio(value / target, 1.0, of=f"{case} warm "
                                                      "real tokens/s", over=f"{target:,}")})
    for size in ("b256", "b32"):
        if warm(f"nccl_{size}") and warm(f"graphs_{size}"):
            out.append({"case": f"nccl_{size}", **harness.ratio(
                warm(f"nccl_{size}") / warm(f"graphs_{size}"), 0.95,
                of="one-rank NCCL group, warm", over="no group, warm")})
        for label, most in (("cold", 60.0), ("warm", 10.0)):
            compiled, plain = fresh_done(f"compiled_{size}", label), fresh_done(f"graphs_{size}")
            if compiled and plain:
                out.append({"case": f"compiled_{size}_{label}_compile_s", **harness.ratio(
                    compiled - plain, most, of="compiled fresh done_s - plain fresh done_s",
                    over="seconds", higher_is_better=False)})
    fill = (cases.get("fill_32k", {}).get("run") or [{}])[0].get("warm", {})
    if fill.get("mfu_vs_table") is not None:
        out.append({"case": "fill_32k", **harness.ratio(fill["mfu_vs_table"], 0.25,
                                                        of="MFU", over="table peak")})
    shared = cases.get("shared_minilm", {})
    four = [r.get("warm", {}).get("real_tokens_per_s") for r in shared.get("four", [])]
    if four and all(four) and warm("shared_minilm", "alone"):
        out.append({"case": "shared_minilm", **harness.ratio(
            sum(four) / warm("shared_minilm", "alone"), 2.5, of="four processes' total",
            over="one alone")})
    return out


def main() -> None:
    import torch

    if not torch.cuda.is_available() and not SMOKE:
        print(f"[bench] {NAME}: skipped: no CUDA device (WELLFED_BENCH_SMOKE=1 checks the script "
              "on a CPU)")
        return
    chosen = sys.argv[1:] or list(CASES)
    unknown = sorted(set(chosen) - set(CASES))
    if unknown:
        sys.exit(f"usage: python benchmarks/gpu_scale.py [{' | '.join(CASES)} ...]; unknown "
                 f"case {unknown[0]!r}")
    harness.require_sst2(NAME)
    import gpu_throughput as gt
    from transformers import AutoTokenizer

    from wellfed import device as dev

    device = dev.device_name(torch.device("cuda", 0) if not SMOKE else torch.device("cpu"))
    folder = Path(tempfile.mkdtemp()) if SMOKE else gt.OUT
    texts, labels = harness.read_sst2("train")
    tokenizer = AutoTokenizer.from_pretrained(harness.model_path())
    clock = harness.Clock()
    cases: dict = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="wellfed-gpu-scale-") as tmp:
        scratch = Path(tmp)
        for case in chosen:
            for label, base, copies, most, reserve in CASES[case]:
                left = DEADLINE - (time.perf_counter() - STARTED)
                limit = min(most, left - (LEAST if reserve is None else reserve))
                if limit < LEAST or any(x.startswith(f"{case} ") for x in skipped):
                    # the later runs of a case are compared with its first: none without it
                    skipped.append(f"{case} {label}: {left:.0f} s left before the deadline")
                    print(f"[bench] skipped {skipped[-1]}", flush=True)
                    continue
                rows = 400 if SMOKE else base["rows"]
                _, arrow = gt.token_rows(texts, labels, tokenizer, scratch, rows)
                spec = spec_for(base, arrow, tokenizer.pad_token_id, scratch, case)
                runs = run_copies(spec, copies, limit, scratch, f"{case}.{label}")
                cases.setdefault(case, {})[label] = runs
                for r in runs:
                    print(f"[bench] {case} {label}: fresh {r.get('fresh', {}).get('done_s')} s "
                          f"-> {r.get('fresh', {}).get('real_tokens_per_s_from_start')} tok/s; "
                          f"warm {r.get('warm', {}).get('real_tokens_per_s')} tok/s "
                          f"{r.get('error') or r.get('timed_out') or ''}", flush=True)
                harness.write_result(NAME, {
                    "what": "issue 29 on one GPU: graphed step, one-rank NCCL group, GPU-filling "
                            "batch, per-shape compile cold and warm, four processes sharing it; "
                            "fresh figures from process start, warm ones once every shape is "
                            "captured; bf16, real (non-pad) tokens/s, SST-2 rows; each run "
                            "loads saved random-init weights with wellfed.model.load_model, "
                            "as a train stage loads a pretrained model",
                    "device": device, "smoke": SMOKE, "compile_mode": MODE,
                    "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    "machine": harness.machine(), "skipped": skipped,
                    "targets": "smoke: no figures" if SMOKE else ratios(cases),
                    "cases": cases, **clock.summary()}, folder=folder)


if __name__ == "__main__":
    main()
