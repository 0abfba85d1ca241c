"""The GPU step that costs what its math costs: wellfed's shape plan + CUDA graphs (the default on
a CUDA GPU, train.cuda_graphs auto) against HF Trainer with group_by_length and against
wellfed's eager step (cuda_graphs false), bf16, side by side in one process.

Parts (`python benchmarks/gpu_graphs.py [PART ...]`, default all, in this order):
  steps     ms per optimizer step at global batch 32 / 64 / 128 / 256 of SST-2 rows (BERT-base),
            graphed once every shape is captured vs eager; host syncs per graphed step (torch's
            sync debug mode) and kernel time vs wall (torch.profiler) at 32 and 256
  accuracy  pretrained MiniLM, tests/e2e/test_sst2.py's recipe until 2026-11-29 (first 20,000 SST-2
            train rows, 1 epoch, batch 32, lr 1e-4): SST-2 dev accuracy, graphed (3 seeds) and
            eager (seed 42); the same recipe on this CPU through the pipeline: 0.8693
  table     real tokens/s vs the Trainer: BERT-base batch 32 on 20,000 rows (3 seeds a side,
            A B B A A B), BERT-base batch 256 on all 67,349 rows (micro_batch_tokens 16,384) and
            MiniLM batch 32 on 20,000 rows (A B B A); per run: MFU, NVML utilisation, peak
            memory, capture seconds and the per-step losses (the Trainer logs 50-step means,
            so wellfed's curve is also given in 50-step means)
  eager     BERT-base batch 256, graphed vs eager, 3 seeds each (seed k: the same batches):
            the speed-up, and the mean loss over the last 20% of steps
Every run starts from a fresh model and setup, so each graphed run pays its own capture inside
its timed window (end of step 1 to end of the last step, synchronised); the first graphed run
of the process is reported apart (`fresh_process`): its capture seconds and first steps.
Models are random-init from the MiniLM config (6 x 384) or BERT-base-sized (12 x 768), except
`accuracy`'s pretrained MiniLM. Results go to benchmarks/results/gpu/gpu_graphs.json, rewritten
after every run and merged with the parts a previous call measured (each part names its device).
WELLFED_SST2_DIR and WELLFED_MODEL_DIR as in harness.py; WELLFED_BENCH_DEADLINE_S: start no run
after that many seconds (a run cut there keeps the rest). WELLFED_BENCH_SMOKE=1 runs every part
tiny on a CPU (a check of this script, no figures).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import gpu_throughput as gt
import harness
import numpy as np
import train_throughput as tt

NAME = "gpu_graphs"
SMOKE = os.environ.get("WELLFED_BENCH_SMOKE") == "1"
DEADLINE = float(os.environ.get("WELLFED_BENCH_DEADLINE_S") or "inf")
STARTED = time.perf_counter()
LR = {32: 1e-4, 64: 1e-4, 128: 2e-4, 256: 3e-4}
TABLE = [  # (model, global batch, rows (0 = all), micro_batch_tokens, runs in order)
    ("bert_base", 32, 20_000, 0, ("wellfed", "trainer", "trainer", "wellfed", "wellfed", "trainer")),
    ("bert_base", 256, 0, 16_384, ("wellfed", "trainer", "trainer", "wellfed")),
    ("minilm", 32, 20_000, 0, ("wellfed", "trainer", "trainer", "wellfed")),
]
FRESH: dict = {}


def late() -> bool:
    return time.perf_counter() - STARTED > DEADLINE


def device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() and not SMOKE else "cpu")


def wellfed_run(data, arrow: Path, pad_id: int, model_fn, *, batch: int, micro_tokens: int = 0,
                lr: float, seed: int, graphed: bool = True, sampler=None, max_steps: int = 0,
                epochs: int = 1) -> tuple[dict, object, object]:
    """One run of wellfed's own setup / feed / train_step (what loop.train runs); returns
    (record, model, setup). Stamps after each step, synchronised after the first, the middle and
    the last; the per-step losses are read once at the end."""
    import torch

    from wellfed.config import TrainConfig
    from wellfed.data.batching import collate
    from wellfed.telemetry.meter import StepMeter
    from wellfed.telemetry.peak import Peak
    from wellfed.train.step.feeding import feed
    from wellfed.train.step.setup import setup
    from wellfed.train.step.step import train_step

    dev_ = device()
    cfg = TrainConfig(epochs=epochs, max_steps=max_steps, lr=lr, weight_decay=tt.WEIGHT_DECAY,
                      warmup_ratio=tt.WARMUP, global_batch_size=batch, micro_batch_size=batch,
                      micro_batch_tokens=micro_tokens, max_grad_norm=tt.CLIP,
                      precision="bf16" if dev_.type == "cuda" else "fp32", seed=seed,
                      cuda_graphs="true" if graphed else "false")
    model = model_fn().to(dev_)
    sync = torch.cuda.synchronize if dev_.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    s = setup(cfg, model, len(data), dev_, lengths=data.lengths)
    setup_s = time.perf_counter() - start
    torch.manual_seed(seed)  # dropout
    meter = StepMeter(dev_, Peak(1.0, "unused"), s.model.config)

    def gather(idx):
        return collate(data, idx, pad_id, s.spec)

    stamps, values, counts = [], [], []
    for step, batches in feed(s, data, arrow, pad_id, epochs=epochs):
        if len(stamps) >= s.steps:
            break
        values.append(train_step(s, step, batches, meter, data.lengths, gather))
        if len(stamps) in (0, s.steps // 2, s.steps - 1):
            sync()
        stamps.append((time.perf_counter(), time.process_time()))
        counts.append((step.real_tokens, step.padded_tokens))
        if len(stamps) == 1 and sampler:
            sampler.snapshot()  # NVML means over the timed window only
    losses = torch.stack([v.loss for v in values]).float().cpu().numpy()
    record = tt.run_record(stamps, losses.tolist(), counts)
    record.pop("cpu_share", None)
    half = s.steps // 2
    record.update({
        "seed": seed, "path": "cuda_graphs" if s.graphs is not None and s.graphs.capture
        else ("planned_eager" if s.graphs is not None else "dynamic"),
        "steady_real_tokens_per_s": round(sum(c[0] for c in counts[half + 1:])
                                          / (stamps[-1][0] - stamps[half][0]), 1)
        if len(stamps) > half + 1 else None,
        "ms_per_step": round((stamps[-1][0] - stamps[0][0]) * 1e3 / max(len(stamps) - 1, 1), 3),
        "setup_s": round(setup_s, 3), "first_step_s": round(stamps[0][0] - start - setup_s, 3),
        "losses": [round(float(x), 4) for x in losses],
        "loss_50_step_means": [round(float(losses[i:i + 50].mean()), 4)
                               for i in range(0, len(losses), 50)],
        "shapes": len(s.spec.widths)})
    if s.graphs is not None:
        g = s.graphs
        record.update({"graph_capture_s": round(g.capture_s, 3), "graphs_captured": len(g.micro)
                       + (g.update is not None), "graph_replays": g.replays,
                       "eager_micro_batches": g.eager, "capture_failed": g.failed})
        note_fresh(s, setup_s, round(stamps[min(9, len(stamps) - 1)][0] - start - setup_s, 3))
    return record, s.model, s


def note_fresh(s, setup_s: float, first_10_steps_s: float) -> None:
    """The first graphed run of this process: what capturing cost with nothing warm."""
    if not FRESH and s.graphs is not None and s.graphs.capture:
        FRESH.update({"hidden_size": s.model.config.hidden_size,
                      "global_batch": s.spec.global_batch, "setup_s": round(setup_s, 3),
                      "graph_capture_s": round(s.graphs.capture_s, 3),
                      "graphs_captured": len(s.graphs.micro) + (s.graphs.update is not None),
                      "first_10_steps_s": first_10_steps_s})


def trainer_run(dataset, tokenizer, out: str, model_fn, *, batch: int, lr: float, seed: int,
                sampler=None) -> tuple[dict, object]:
    record, model, _ = tt.train_hf(dataset, tokenizer, True, out, model_fn=model_fn,
                                   cuda=device().type == "cuda", batch=batch, lr=lr,
                                   sampler=sampler, seed=seed)
    record.pop("cpu_share", None)
    record["seed"] = seed
    return record, model


def figures(model, record: dict, batch: int, sampler, device_name: str) -> None:
    gt.rows_per_step(record, batch)
    if device().type == "cuda":
        record.update(gt.gpu_figures(model, record, sampler, device_name))


def pooled(runs: list[dict]) -> float:
    return round(sum(r["timed_real_tokens"] for r in runs)
                 / sum(r["timed_seconds"] for r in runs), 1)


def table(ctx: dict, save) -> dict:
    import datasets
    import torch

    chosen = os.environ.get("WELLFED_BENCH_CASES", "")
    out = dict(ctx["kept"].get("table", {})) if chosen else {}
    out = {k: v for k, v in out.items() if isinstance(v, dict) and "model" in v}
    for kind, batch, rows, tokens, order in TABLE:
        if chosen and f"{kind}_b{batch}" not in chosen.split(","):
            continue
        rows = min(rows, 600) if SMOKE else rows
        data, arrow = gt.token_rows(ctx["texts"], ctx["labels"], ctx["tokenizer"], ctx["tmp"],
                                    rows or (400 if SMOKE else 0))
        texts = ([ctx["texts"][i] for i in np.sort(np.random.default_rng(gt.SEED).choice(
            len(ctx["texts"]), len(data), replace=False))] if len(data) < len(ctx["texts"])
            else ctx["texts"])
        labels = data.labels
        dataset = datasets.Dataset.from_dict({"text": texts, "label": labels.tolist()}).map(
            lambda b: ctx["tokenizer"](b["text"], truncation=True, max_length=128), batched=True,
            remove_columns=["text"])
        case, runs, seeds = f"{kind}_b{batch}", {"wellfed": [], "trainer": []}, {}
        # Untimed: the first run of a model shape in a process pays CUDA's and the attention
        # kernels' first-use costs (the first 10 steps of a fresh process took 14.6 s).
        warm, _, _ = wellfed_run(data, arrow, ctx["pad"], gt.model_factory(kind, 0) if not SMOKE
                                 else ctx["tiny"](0), batch=batch, micro_tokens=tokens,
                                 lr=LR[batch], seed=0)
        runs["warmup_wellfed_untimed"] = {k: warm[k] for k in ("real_tokens_per_s", "setup_s",
                                                                "first_step_s", "graph_capture_s")}
        for n, who in enumerate(order, 1):
            if late():
                runs.setdefault("skipped", []).append(f"run {n} ({who}): past the deadline")
                continue
            seed = seeds[who] = seeds.get(who, 0) + 1
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            model_fn = gt.model_factory(kind, seed) if not SMOKE else ctx["tiny"](seed)
            if who == "wellfed":
                record, model, _ = wellfed_run(data, arrow, ctx["pad"], model_fn, batch=batch,
                                               micro_tokens=tokens, lr=LR[batch], seed=seed,
                                               sampler=ctx["sampler"])
            else:
                record, model = trainer_run(dataset, ctx["tokenizer"], str(ctx["tmp"] / f"hf{n}"),
                                            model_fn, batch=batch, lr=LR[batch], seed=seed,
                                            sampler=ctx["sampler"])
            figures(model, record, batch, ctx["sampler"], ctx["name"])
            del model
            runs[who].append(record)
            print(f"[bench] {case} run {n}/{len(order)} {who} seed {seed}: "
                  f"{record['real_tokens_per_s']:,.0f} real tok/s, padding "
                  f"{record['padding_efficiency']:.3f}, loss(last 20%) "
                  f"{record['loss_last_20pct']:.4f}, util {record.get('gpu_util_pct_mean')}%, "
                  f"capture {record.get('graph_capture_s')} s", flush=True)
            out[case] = summary(kind, batch, len(data), tokens, runs)
            save(out)
    return out


def summary(kind: str, batch: int, rows: int, tokens: int, runs: dict) -> dict:
    done = {k: v for k, v in runs.items() if k in ("wellfed", "trainer") and v}
    rates = {k: pooled(v) for k, v in done.items()}
    tails = {k: [r["loss_last_20pct"] for r in v] for k, v in done.items()}
    result = {"model": kind, "global_batch": batch, "rows": rows, "micro_batch_tokens": tokens,
              "lr": LR[batch], "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "real_tokens_per_s": rates,
              "loss_last_20pct": {k: {"mean": round(float(np.mean(v)), 4),
                                      "spread": round(float(np.ptp(v)), 4), "runs": v}
                                  for k, v in tails.items()},
              "runs": runs}
    if len(rates) == 2:
        result["wellfed_vs_trainer"] = round(rates["wellfed"] / rates["trainer"], 3)
    return result


def eager_vs_graphed(ctx: dict, save) -> dict:
    rows = 600 if SMOKE else 0
    data, arrow = gt.token_rows(ctx["texts"], ctx["labels"], ctx["tokenizer"], ctx["tmp"], rows)
    runs = {"cuda_graphs": [], "eager": []}
    for seed in (1, 2, 3):
        for graphed in (True, False):
            if late():
                continue
            model_fn = gt.model_factory("bert_base", seed) if not SMOKE else ctx["tiny"](seed)
            record, model, _ = wellfed_run(data, arrow, ctx["pad"], model_fn, batch=256,
                                           micro_tokens=16_384, lr=LR[256], seed=seed,
                                           graphed=graphed, sampler=ctx["sampler"])
            figures(model, record, 256, ctx["sampler"], ctx["name"])
            del model
            runs["cuda_graphs" if graphed else "eager"].append(record)
            print(f"[bench] eager-vs-graphed seed {seed} {record['path']}: "
                  f"{record['real_tokens_per_s']:,.0f} real tok/s, loss(last 20%) "
                  f"{record['loss_last_20pct']:.4f}", flush=True)
            save(eager_summary(runs, len(data)))
    return eager_summary(runs, len(data))


def eager_summary(runs: dict, rows: int) -> dict:
    done = {k: v for k, v in runs.items() if v}
    out = {"model": "bert_base", "global_batch": 256, "rows": rows, "micro_batch_tokens": 16_384,
           "real_tokens_per_s": {k: pooled(v) for k, v in done.items()},
           "loss_last_20pct": {k: [r["loss_last_20pct"] for r in v] for k, v in done.items()},
           "runs": runs}
    if len(done) == 2:
        a, b = (np.mean(out["loss_last_20pct"][k]) for k in ("cuda_graphs", "eager"))
        out["loss_last_20pct_gap"] = round(float(a - b), 4)
        out["graphed_vs_eager"] = round(out["real_tokens_per_s"]["cuda_graphs"]
                                        / out["real_tokens_per_s"]["eager"], 3)
    return out


def steps(ctx: dict, save) -> dict:
    """ms per step by global batch: graphed once every shape is captured, and eager."""
    data, arrow = gt.token_rows(ctx["texts"], ctx["labels"], ctx["tokenizer"], ctx["tmp"],
                                600 if SMOKE else 0)
    out = {}
    for batch in (32, 64, 128, 256):
        if late():
            break
        row = {}
        model_fn = gt.model_factory("bert_base", 1) if not SMOKE else ctx["tiny"](1)
        row["cuda_graphs"] = steady_steps(data, arrow, ctx, model_fn, batch, graphed=True,
                                          probe=batch in (32, 256))
        row["eager"] = steady_steps(data, arrow, ctx, model_fn, batch, graphed=False)
        row["graphed_vs_eager"] = round(row["eager"]["ms_per_step"]
                                        / row["cuda_graphs"]["ms_per_step"], 3)
        out[f"b{batch}"] = row
        print(f"[bench] steps b{batch}: graphed {row['cuda_graphs']['ms_per_step']} ms "
              f"({row['cuda_graphs']['real_tokens_per_s']:,.0f} tok/s), eager "
              f"{row['eager']['ms_per_step']} ms", flush=True)
        save(out)
    return out


def steady_steps(data, arrow, ctx, model_fn, batch: int, graphed: bool, probe: bool = False,
                 timed: int = 40) -> dict:
    """Warm up (graphed: until every shape is captured, at most 400 steps), then time `timed`
    steps, synchronised at both ends; with `probe`, also count syncs and profile 5 steps."""
    import torch

    from wellfed.config import TrainConfig
    from wellfed.data.batching import collate
    from wellfed.telemetry.meter import StepMeter
    from wellfed.telemetry.peak import Peak
    from wellfed.train.step.feeding import feed
    from wellfed.train.step.setup import setup
    from wellfed.train.step.step import train_step

    dev_ = device()
    cuda = dev_.type == "cuda"
    cfg = TrainConfig(epochs=1000, lr=LR[batch], global_batch_size=batch, micro_batch_size=batch,
                      precision="bf16" if cuda else "fp32", seed=1,
                      cuda_graphs="true" if graphed else "false")
    begun = time.perf_counter()
    s = setup(cfg, model_fn().to(dev_), len(data), dev_, lengths=data.lengths)
    setup_s = time.perf_counter() - begun
    meter = StepMeter(dev_, Peak(1.0, "unused"), s.model.config)
    fed = feed(s, data, arrow, ctx["pad"], epochs=1000)

    def one():
        step, batches = next(fed)
        train_step(s, step, batches, meter, data.lengths,
                   lambda idx: collate(data, idx, ctx["pad"], s.spec))
        return step

    warm = 0
    while warm < (400 if graphed and not SMOKE else 10):
        one()
        warm += 1
        if graphed and set(s.spec.shapes()) <= set(s.graphs.micro) and s.graphs.update:
            break
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    note_fresh(s, setup_s, round(time.perf_counter() - begun - setup_s, 3))
    eager_before = s.graphs.eager if s.graphs else 0
    start = time.perf_counter()
    real = padded = 0
    for _ in range(timed):
        step = one()
        real, padded = real + step.real_tokens, padded + step.padded_tokens
    sync()
    seconds = time.perf_counter() - start
    out = {"warmup_steps": warm, "timed_steps": timed,
           "ms_per_step": round(seconds * 1e3 / timed, 3),
           "real_tokens_per_step": round(real / timed, 1),
           "padded_tokens_per_step": round(padded / timed, 1),
           "real_tokens_per_s": round(real / seconds, 1),
           "eager_micro_batches_while_timed": (s.graphs.eager - eager_before) if s.graphs else None,
           "shapes_captured": len(s.graphs.micro) if s.graphs else None,
           "graph_capture_s": round(s.graphs.capture_s, 3) if s.graphs else None}
    if probe and cuda:
        out.update(gt.count_syncs(lambda: one(), 5))
        out.update(kernel_share(one, 5))
    return out


def kernel_share(one, n: int) -> dict:
    """Kernel time per step (torch.profiler, graph replays included) against the step's wall."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    try:
        torch.cuda.synchronize()
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                one()
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / n
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        busy = sum(e.device_time for e in kernels) / 1e6 / n
        return {"profiled_ms_per_step": round(wall * 1e3, 3),
                "kernel_ms_per_step": round(busy * 1e3, 3),
                "kernels_per_step": round(len(kernels) / n, 1),
                "kernel_share_of_profiled_wall": round(busy / wall, 3)}
    except Exception as err:  # noqa: BLE001 - a profiler that cannot see graphs is a finding
        return {"profile_error": f"{type(err).__name__}: {err}"[:200]}


def accuracy(ctx: dict, save) -> dict:
    """The recipe of tests/e2e/test_sst2.py on the GPU path; dev accuracy per run."""
    import torch
    from transformers import AutoModelForSequenceClassification

    rows = 300 if SMOKE else 20_000
    texts, labels = ctx["texts"][:rows], ctx["labels"][:rows]  # the first rows, as the e2e test
    data, arrow = first_rows(texts, labels, ctx, "acc")
    dev_texts, dev_labels = harness.read_sst2("dev")
    dev_data, _ = first_rows(dev_texts[:100] if SMOKE else dev_texts,
                             dev_labels[:100] if SMOKE else dev_labels, ctx, "dev")
    out = {"rows": len(data), "recipe": "epochs 1, lr 1e-4, batch 32, warmup 0.06, wd 0.01, "
           "clip 1.0, bf16 (tests/e2e/test_sst2.py)", "cpu_pipeline_reference": 0.8693,
           "weights": "all-MiniLM-L6-v2 carried as fp16 safetensors, loaded as fp32", "runs": []}
    for seed, graphed in ((42, True), (42, False), (1, True), (2, True)):
        if late():
            break

        def model_fn(seed=seed):
            torch.manual_seed(seed)
            if SMOKE:
                return ctx["tiny"](seed)()
            return AutoModelForSequenceClassification.from_pretrained(
                harness.model_path(), num_labels=2, dtype=torch.float32)

        record, model, s = wellfed_run(data, arrow, ctx["pad"], model_fn, batch=32, lr=1e-4,
                                       seed=seed, graphed=graphed)
        acc = dev_accuracy(model, dev_data, ctx["pad"], s)
        out["runs"].append({"seed": seed, "path": record["path"], "dev_accuracy": acc,
                            "real_tokens_per_s": record["real_tokens_per_s"],
                            "loss_last_20pct": record["loss_last_20pct"],
                            "graph_capture_s": record.get("graph_capture_s")})
        print(f"[bench] accuracy seed {seed} {record['path']}: dev {acc:.4f}, "
              f"{record['real_tokens_per_s']:,.0f} real tok/s", flush=True)
        graphed_accs = [r["dev_accuracy"] for r in out["runs"] if r["path"] == "cuda_graphs"]
        if graphed_accs:
            out["graphed_mean_dev_accuracy"] = round(float(np.mean(graphed_accs)), 4)
        save(out)
    return out


def first_rows(texts, labels, ctx, tag: str):
    from wellfed.data.token_files import TokenFile, write_token_file
    from wellfed.data.tokenization import SplitTokenizer

    parquet = harness.write_parquet(ctx["tmp"] / f"{tag}.parquet", list(texts), labels)
    arrow = ctx["tmp"] / f"{tag}.arrow"
    write_token_file(arrow, SplitTokenizer(ctx["tokenizer"], 128, 8192).batches(str(parquet),
                                                                                 "train"))
    return TokenFile(arrow), arrow


def dev_accuracy(model, dev_data, pad_id: int, s) -> float:
    """Dev accuracy as the evaluate stage scores it (predictions.predict, the exported model's
    path), on this device and precision."""
    from wellfed.evaluate.predictions import predict

    probs = predict(model, dev_data, pad_id, s.device, s.precision)
    return round(float((probs.argmax(1) == dev_data.labels).mean()), 4)


def context(tmp: Path) -> dict:
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from wellfed import device as dev
    from wellfed.telemetry.gpu import DeviceSampler

    hf_logging.set_verbosity_error()
    texts, labels = harness.read_sst2("train")
    tokenizer = AutoTokenizer.from_pretrained(harness.model_path())
    dev_ = device()

    def tiny(seed):
        def make():
            from transformers import BertConfig, BertForSequenceClassification

            torch.manual_seed(seed)
            return BertForSequenceClassification(BertConfig(
                hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64, num_labels=2))
        return make

    return {"texts": texts, "labels": labels, "tokenizer": tokenizer, "tmp": tmp,
            "pad": tokenizer.pad_token_id, "tiny": tiny, "name": dev.device_name(dev_),
            "sampler": DeviceSampler(dev_, interval_s=0.2).start()}


def main() -> None:
    import datasets
    import torch

    if not torch.cuda.is_available() and not SMOKE:
        print(f"[bench] {NAME}: skipped: no CUDA device (WELLFED_BENCH_SMOKE=1 checks the script "
              "on a CPU)")
        return
    harness.require_sst2(NAME)
    datasets.disable_progress_bars()
    parts = sys.argv[1:] or ["steps", "accuracy", "table", "eager"]
    runners = {"steps": steps, "accuracy": accuracy, "table": table, "eager": eager_vs_graphed}
    unknown = sorted(set(parts) - set(runners))
    if unknown:
        sys.exit(f"usage: python benchmarks/gpu_graphs.py [{' | '.join(runners)} ...]; "
                 f"unknown part {unknown[0]!r}")
    folder = Path(tempfile.mkdtemp()) if SMOKE else gt.OUT
    path = folder / f"{NAME}.json"
    kept = json.loads(path.read_text()).get("parts", {}) if path.is_file() else {}
    clock = harness.Clock()
    with tempfile.TemporaryDirectory() as tmp:
        ctx = {**context(Path(tmp)), "kept": dict(kept)}
        stamp = {"device": ctx["name"], "machine": harness.machine(),
                 "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        for part in parts:
            def save(result, part=part):
                kept[part] = {**stamp, "fresh_process": dict(FRESH), **result}
                harness.write_result(NAME, {
                    "what": "the shape plan + CUDA graphs step (train.cuda_graphs) vs HF "
                            "Trainer group_by_length and vs wellfed's eager step; bf16, real "
                            "(non-pad) tokens/s, SST-2 rows", "device": ctx["name"],
                    "parts": kept, **clock.summary()}, folder=folder)
            save(runners[part](ctx, save))
        ctx["sampler"].stop()


if __name__ == "__main__":
    main()
