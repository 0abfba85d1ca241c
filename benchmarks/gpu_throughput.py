"""GPU training throughput: wellfed's step vs Hugging Face Trainer, bf16, same rows, one run.

Needs a CUDA GPU (writes a skip result otherwise); needs no Ray, MLflow or DVC: wellfed runs its
single-process path (train_throughput.train_wellfed: the loop's own micro_batches + train_step).
Contenders, on the same SST-2 train rows tokenized by the same tokenizer:
  wellfed          iterate_steps (pool_batches 64) + train_step, bf16 autocast, fused AdamW,
                   pinned non-blocking copies: the default step path, which on CUDA is now the
                   shape plan + CUDA graphs (train.cuda_graphs; the figures in
                   results/gpu/gpu_throughput.json were measured before, with the eager step
                   and pad multiple 8; benchmarks/gpu_graphs.py measures the graphed one)
  trainer_grouped  HF Trainer, bf16=True, group_by_length, DataCollatorWithPadding(pad 8), pinned
Both random-init (no download): MiniLM (the packaged all-MiniLM-L6-v2 config: 6 x 384) and a
BERT-base-sized model (12 x 768, 3072 MLP, 12 heads, the same 30,522 WordPiece vocabulary).
Cases: global batch 32 (the recipe) on 20,000 rows, and global batch 256 on all 67,349 rows (a
user raising the batch to fill the GPU; wellfed's micro-batches then also carry a 16,384-token
budget). Each case starts with an untimed wellfed warm-up run (the first run of a new model
shape pays cuDNN attention plan building: 15-25% slower in a first try), then runs go A B B A;
throughput pools each side's runs. Timed from the end of the first optimizer step to the end
of the last, synchronised at both ends. For each run: real
tokens/s, MFU of the useful (non-pad) work against the device's table peak, peak memory
(torch.cuda.max_memory_allocated), mean GPU utilisation from wellfed's own NVML sampler.
`python benchmarks/gpu_throughput.py step` instead looks inside wellfed's step (BERT-base):
a torch.profiler trace of 5 steps at batch 32 (where the time goes), the host/device syncs per
step (torch.cuda sync debug mode, with the Python line that caused each), and pad multiple 8 vs 1
at batch 256 (A B B A), into gpu_step.json.
`python benchmarks/gpu_throughput.py auto` measures two train knobs on BERT-base, bf16, wellfed
alone (its setup/feed/train_step, the path loop.train runs), into gpu_autobatch.json:
  micro_batch_tokens auto at global batch 256 on all train rows: the budget the probe found, how
  (setup's seconds, the probe included), real tokens/s and peak memory;
  compile off vs on at batch 32 (4,000 rows) and 256 (12,000 rows): an untimed warm-up run of
  each (it pays the compiling), then A B B A. Compiling happens at the first step (outside the
  timed window) and again at the first changes of shape (inside it), so each run also records
  `first_steps_s` (its first 3 steps) and `steady_real_tokens_per_s` (its second half of steps).
  The result file is rewritten after each part, so a run cut short keeps what it measured.
  Seen on an H100 (torch 2.11, 2026-11-23): the first compiled run stalled over 5 minutes (and
  over 7 with TORCHINDUCTOR_COMPILE_THREADS=1) in inductor compiling its third graph, the
  dynamic-width one without an attention mask (a batch with no padding); a compiled model is
  now always given the mask. `compile` runs this part alone, keeping the auto figures.

usage: python benchmarks/gpu_throughput.py [step|auto|compile]   (WELLFED_SST2_DIR, WELLFED_MODEL_DIR override)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import harness
import train_throughput as tt

NAME = "gpu_throughput"
OUT = harness.RESULTS / "gpu"
SEED = 42
CASES = [  # (model, global batch, rows, wellfed micro_batch_tokens)
    ("minilm", 32, 20_000, 0), ("bert_base", 32, 20_000, 0),
    ("minilm", 256, 0, 16_384), ("bert_base", 256, 0, 16_384),
]
ORDER = ("wellfed", "trainer_grouped", "trainer_grouped", "wellfed")
LR_FOR_BATCH = {32: 1e-4, 256: 3e-4}
COMPILE_CASES = ((32, 4_000), (256, 12_000))  # (global batch, rows): 125 and 47 steps a run
BERT_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072}


def model_factory(kind: str, seed: int = SEED):
    def make():
        import torch
        from transformers import AutoConfig, AutoModelForSequenceClassification

        config = AutoConfig.from_pretrained(harness.model_path(), num_labels=2)
        if kind == "bert_base":
            for key, value in BERT_BASE.items():
                setattr(config, key, value)
        torch.manual_seed(seed)
        return AutoModelForSequenceClassification.from_config(config)
    return make


TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64}  # WELLFED_BENCH_SMOKE: a check of a script on a CPU


def save_encoder(kind: str, folder: Path, seed: int = SEED) -> Path:
    """A random-init encoder of `kind` (minilm, bert_base, tiny) saved in `folder` as a
    checkpoint without a classifier head, as MiniLM ships, beside MiniLM's tokenizer files: a
    run that loads it with wellfed.model.load_model (a fresh head) pays what a train stage
    loading a pretrained model pays, not a random init of every weight on the CPU, which only
    the benchmark needs (BERT-base: docs/gpu.md has both figures)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(harness.model_path())
    for key, value in {"bert_base": BERT_BASE, "tiny": TINY}.get(kind, {}).items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    AutoModel.from_config(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        if (Path(harness.model_path()) / name).exists():
            shutil.copy(Path(harness.model_path()) / name, folder / name)
    return folder


def gpu_figures(model, record: dict, sampler, device_name: str) -> dict:
    """MFU of useful tokens vs the table peak, peak memory, NVML means over the timed window."""
    import torch
    from wellfed.model import flops_per_token
    from wellfed.telemetry.peak import table_peak

    config = model.config
    seq = record["timed_padded_tokens"] / max(record["timed_rows"], 1)
    peak = table_peak(device_name, "bf16")
    useful = record["real_tokens_per_s"] * flops_per_token(config, seq)
    nvml = sampler.snapshot()
    return {"mfu_vs_table": round(useful / peak.flops, 4) if peak else None,
            "peak_source": peak.source if peak else None,
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
            "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 3),
            "gpu_util_pct_mean": round(nvml.get("gpu_util_pct", float("nan")), 1),
            "gpu_power_w_mean": round(nvml.get("gpu_power_w", float("nan")), 1)}


def rows_per_step(record: dict, batch: int) -> None:
    record["timed_rows"] = (record["steps"] - 1) * batch  # every step but the last is full
    record["samples_per_s"] = round(record["timed_rows"] / record["timed_seconds"], 1)


def profile_steps(data, path: Path, pad_id: int, steps: int = 5) -> dict:
    """torch.profiler over `steps` wellfed steps (BERT-base, batch 32) after 10 warm-up steps."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    from wellfed.config import TrainConfig
    from wellfed.data.batching import iterate_steps
    from wellfed.telemetry.meter import StepMeter
    from wellfed.telemetry.peak import Peak
    from wellfed.train.step.feeding import micro_batches
    from wellfed.train.step.setup import setup
    from wellfed.train.step.step import train_step

    device = torch.device("cuda")
    cfg = TrainConfig(lr=1e-4, precision="bf16", global_batch_size=32, micro_batch_size=32, seed=SEED)
    s = setup(cfg, model_factory("bert_base")().to(device), len(data), device,
              lengths=data.lengths)
    meter = StepMeter(device, Peak(1.0, "unused"), s.model.config)
    fed = micro_batches(iterate_steps(data.lengths, s.spec, 0), data, path, pad_id, s.spec, 0, 2,
                        True)

    def one():
        step, batches = next(fed)
        train_step(s, step, batches, meter, data.lengths)

    for _ in range(10):
        one()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        one()
    torch.cuda.synchronize()
    unprofiled_ms = (time.perf_counter() - start) * 1e3 / 20
    syncs = count_syncs(one, steps)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            one()
        torch.cuda.synchronize()
        profiled_ms = (time.perf_counter() - start) * 1e3 / steps
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    groups = {"attention (cuDNN/flash SDPA)": ("sdpa", "flash", "fmha", "attention", "efficient"),
              "matmul (GEMM)": ("gemm", "cutlass", "nvjet", "sm90_", "cublas"),
              "optimizer (fused AdamW)": ("adam", "multi_tensor"),
              "copies (memcpy/memset)": ("memcpy", "memset"),
              "norm/softmax/elementwise/other": ("",)}
    time_us = dict.fromkeys(groups, 0.0)
    for event in kernels:
        name = event.name.lower()
        group = next(g for g, keys in groups.items() if any(k in name for k in keys))
        time_us[group] += event.device_time
    # Shares of the UNPROFILED step: the profiler's own host overhead inflates the traced wall.
    wall = unprofiled_ms / 1e3 * steps
    busy = sum(time_us.values()) / 1e6
    launches = [e for e in prof.events() if e.name in ("cudaLaunchKernel", "cuLaunchKernel",
                                                         "cudaLaunchKernelExC", "cuLaunchKernelEx")]
    table = {g: {"ms_per_step": round(t / 1e3 / steps, 3), "share_of_wall": round(t / 1e6 / wall, 3)}
             for g, t in time_us.items()}
    table["GPU idle (launch gaps, host work)"] = {"ms_per_step": round((wall - busy) * 1e3 / steps, 3),
                                                  "share_of_wall": round(max(wall - busy, 0) / wall, 3)}
    top = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15)
    (OUT / "gpu_profile_top_ops.txt").write_text(top)
    return {"steps": steps, "batch": 32, "model": "bert_base",
            "unprofiled_ms_per_step": round(unprofiled_ms, 3), **syncs,
            "profiled_ms_per_step": round(profiled_ms, 3),
            "kernels_per_step": round(len(kernels) / steps, 1),
            "kernel_launches_per_step": round(len(launches) / steps, 1),
            "host_launch_ms_per_step": round(sum(e.cpu_time_total for e in launches) / 1e3 / steps, 3),
            "breakdown": table}


def count_syncs(one, steps: int) -> dict:
    """Host/device synchronisations in `steps` calls of `one`, with the Python frames causing them
    (torch.cuda's sync debug mode warns on each synchronising call)."""
    import traceback
    import warnings
    from collections import Counter

    import torch

    where: Counter = Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message).lower():
            frames = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename]
            if frames[-2].name == "count_syncs":  # switching the debug mode off, not the step
                return
            where[" <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                              for f in reversed(frames[-3:]))] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                one()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return {"syncs_per_step": round(sum(where.values()) / steps, 2),
            "sync_sources": dict(where.most_common(8))}


def pad_multiple_ab(data, arrow: Path, pad_id: int, sampler, device_name: str) -> dict:
    """wellfed, BERT-base, batch 256, pad multiple 8 vs 1: does tensor-core alignment pay for the
    extra padding on short texts? The first run of each is kept apart as `cold`: new shapes pay
    cuDNN attention plan building, and pad 1 makes ~8x as many distinct widths."""
    runs, cold = {8: [], 1: []}, {}
    for multiple in (8, 1, 8, 1, 1, 8):
        record, model = tt.train_wellfed(data, arrow, pad_id, model_fn=model_factory("bert_base"),
                                         device="cuda", precision="bf16", batch=256,
                                         micro_tokens=16_384, lr=LR_FOR_BATCH[256],
                                         pad_multiple=multiple, sampler=sampler)
        rows_per_step(record, 256)
        record.update(gpu_figures(model, record, sampler, device_name))
        record.pop("cpu_share", None)
        del model
        first = multiple not in cold
        if first:
            cold[multiple] = record
        else:
            runs[multiple].append(record)
        print(f"[bench] gpu: pad {multiple}{' (cold)' if first else ''}: "
              f"{record['real_tokens_per_s']:,.0f} real tok/s, padding {record['padding_efficiency']:.3f}",
              flush=True)
    pooled = {m: round(sum(r["timed_real_tokens"] for r in rs) / sum(r["timed_seconds"] for r in rs), 1)
              for m, rs in runs.items()}
    return {"model": "bert_base", "global_batch": 256, "real_tokens_per_s": pooled,
            "pad1_vs_pad8": round(pooled[1] / pooled[8], 3),
            "cold_real_tokens_per_s": {m: r["real_tokens_per_s"] for m, r in cold.items()},
            "runs": runs, "cold_runs": cold}


def run_knobs(data, arrow: Path, pad_id: int, *, batch: int, tokens: int | str = 0,
              compile: bool = False, sampler=None) -> tuple[dict, object, dict]:
    """One epoch of wellfed (BERT-base, bf16) through the loop's own setup (which runs the auto
    probe and torch.compile), feed and train_step; (run record, model, what setup chose)."""

    import torch
    from wellfed.config import TrainConfig
    from wellfed.data.batching import collate
    from wellfed.telemetry.meter import StepMeter
    from wellfed.telemetry.peak import Peak
    from wellfed.train.step.feeding import feed
    from wellfed.train.step.setup import setup
    from wellfed.train.step.step import train_step

    device = torch.device("cuda")
    cfg = TrainConfig(epochs=1, lr=LR_FOR_BATCH[batch], weight_decay=tt.WEIGHT_DECAY,
                      warmup_ratio=tt.WARMUP, global_batch_size=batch, micro_batch_size=batch,
                      micro_batch_tokens=tokens, max_grad_norm=tt.CLIP, precision="bf16",
                      seed=SEED, compile=compile)
    model = model_factory("bert_base")().to(device)
    torch.cuda.synchronize()
    start = time.perf_counter()
    s = setup(cfg, model, len(data), device, lengths=data.lengths)
    setup_s = time.perf_counter() - start
    torch.manual_seed(cfg.seed)  # dropout
    meter = StepMeter(device, Peak(1.0, "unused"), s.model.config)
    def gather(idx):
        return collate(data, idx, pad_id, s.spec)

    stamps, values, counts = [], [], []
    for step, batches in feed(s, data, arrow, pad_id):
        values.append(train_step(s, step, batches, meter, data.lengths, gather))
        stamps.append(tt.stamp(sync=len(stamps) in (0, s.steps - 1, s.steps // 2)))
        counts.append((step.real_tokens, step.padded_tokens))
        if len(stamps) == 1 and sampler:
            sampler.snapshot()  # NVML means over the timed window only
    record = tt.run_record(stamps, [float(v.loss) for v in values], counts)
    half = s.steps // 2  # stamps[half] is the end of step half + 1, synchronised
    record["steady_real_tokens_per_s"] = round(
        sum(c[0] for c in counts[half + 1:]) / (stamps[-1][0] - stamps[half][0]), 1)
    record["first_step_s"] = round(stamps[0][0] - start - setup_s, 3)
    record["first_steps_s"] = round(stamps[2][0] - start - setup_s, 3)
    chose = {"setup_s": round(setup_s, 3), "micro_batch_tokens": s.spec.micro_tokens,
             "how": s.budget_note, "halvings": s.halvings, "compiled": s.compiled is not None}
    return record, s.model, chose


def autobatch_and_compile(texts_all, labels_all, tokenizer, tmp: Path, sampler,
                          device_name: str, save, results: dict | None = None) -> dict:
    """gpu_autobatch.json's figures: micro_batch_tokens auto at batch 256 (unless `results`
    holds them already), compile off vs on; `save(results)` after each part."""
    import faulthandler

    import torch

    if results is None:
        data, arrow = token_rows(texts_all, labels_all, tokenizer, tmp, 0)
        torch.cuda.reset_peak_memory_stats()
        record, model, chose = run_knobs(data, arrow, tokenizer.pad_token_id, batch=256,
                                         tokens="auto", sampler=sampler)
        rows_per_step(record, 256)
        record.update(gpu_figures(model, record, sampler, device_name))
        record.pop("cpu_share", None)
        del model
        results = {"auto_b256": {"rows": len(data), **chose, "run": record}}
        save(results)
        print(f"[bench] gpu auto: budget {chose['micro_batch_tokens']} ({chose['how']}), "
              f"setup {chose['setup_s']} s, {record['real_tokens_per_s']:,.0f} real tok/s, "
              f"peak {record['peak_memory_gb']} GB", flush=True)
    for batch, rows in COMPILE_CASES:
        data, arrow = token_rows(texts_all, labels_all, tokenizer, tmp, rows)
        runs, warm = {False: [], True: []}, {}
        for compiled in (False, True, False, True, True, False):  # warm-ups, then A B B A
            faulthandler.dump_traceback_later(240)  # a run that stalls says where
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            record, model, chose = run_knobs(data, arrow, tokenizer.pad_token_id,
                                             batch=batch, compile=compiled, sampler=sampler)
            rows_per_step(record, batch)
            record.update(gpu_figures(model, record, sampler, device_name), **chose)
            record.pop("cpu_share", None)
            del model
            faulthandler.cancel_dump_traceback_later()
            (runs[compiled] if compiled in warm else warm.setdefault(compiled, [])).append(record)
            print(f"[bench] gpu compile={compiled} b{batch}: "
                  f"{record['real_tokens_per_s']:,.0f} real tok/s "
                  f"(steady {record['steady_real_tokens_per_s']:,.0f}), first step "
                  f"{record['first_step_s']} s, first 3 {record['first_steps_s']} s, "
                  f"MFU {record['mfu_vs_table']}", flush=True)
        pooled = {c: round(sum(r["timed_real_tokens"] for r in rs)
                           / sum(r["timed_seconds"] for r in rs), 1) for c, rs in runs.items()}
        results[f"compile_b{batch}"] = {
            "rows": len(data), "real_tokens_per_s": {"off": pooled[False], "on": pooled[True]},
            "on_vs_off": round(pooled[True] / pooled[False], 3),
            "steady_on_vs_off": round(
                np.mean([r["steady_real_tokens_per_s"] for r in runs[True]])
                / np.mean([r["steady_real_tokens_per_s"] for r in runs[False]]), 3),
            "runs": {"off": runs[False], "on": runs[True]},
            "warmup_runs": {"off": warm[False], "on": warm[True]}}
        save(results)
    return results


def token_rows(texts_all, labels_all, tokenizer, tmp: Path, rows: int):
    """SST-2 train rows (a seeded sample of `rows`, 0 = all) as a token file, as the cases use."""
    from wellfed.data.token_files import TokenFile, write_token_file
    from wellfed.data.tokenization import SplitTokenizer

    pick = (np.sort(np.random.default_rng(SEED).choice(len(texts_all), rows, replace=False))
            if rows else np.arange(len(texts_all)))
    arrow = tmp / f"train_{len(pick)}.arrow"
    if not arrow.exists():
        parquet = harness.write_parquet(tmp / f"train_{len(pick)}.parquet",
                                        [texts_all[i] for i in pick], labels_all[pick])
        write_token_file(arrow, SplitTokenizer(tokenizer, 128, 8192).batches(str(parquet), "train"))
    return TokenFile(arrow), arrow


def cuda_session():
    """What every GPU mode starts with: quiet transformers, the output folder, the device and its
    name, SST-2 train, the tokenizer, and wellfed's NVML sampler (started)."""
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging
    from wellfed import device as dev
    from wellfed.telemetry.gpu import DeviceSampler

    hf_logging.set_verbosity_error()
    OUT.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    texts, labels = harness.read_sst2("train")
    tokenizer = AutoTokenizer.from_pretrained(harness.model_path())
    return (device, dev.device_name(device), texts, labels, tokenizer,
            DeviceSampler(device, interval_s=0.2).start())


def main() -> None:
    import torch

    if not torch.cuda.is_available():  # no result file: it would replace a real GPU's figures
        print(f"[bench] {NAME}: skipped: no CUDA device")
        return
    if sys.argv[1:] in (["auto"], ["compile"]):
        return main_auto(compile_only=sys.argv[1] == "compile")
    harness.require_sst2(NAME)
    clock = harness.Clock()
    import datasets
    from wellfed.data.token_files import TokenFile, write_token_file
    from wellfed.data.tokenization import SplitTokenizer

    datasets.disable_progress_bars()
    device, device_name, texts_all, labels_all, tokenizer, sampler = cuda_session()
    step_mode = sys.argv[1:] == ["step"]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for model_kind, batch, rows, micro_tokens in CASES:
            if step_mode and (model_kind, batch) not in (("bert_base", 32), ("bert_base", 256)):
                continue
            pick = (np.sort(np.random.default_rng(SEED).choice(len(texts_all), rows, replace=False))
                    if rows else np.arange(len(texts_all)))
            texts, labels = [texts_all[i] for i in pick], labels_all[pick]
            arrow = tmp / f"train_{len(pick)}.arrow"
            if not arrow.exists():
                parquet = harness.write_parquet(tmp / f"train_{len(pick)}.parquet", texts, labels)
                write_token_file(arrow, SplitTokenizer(tokenizer, 128, 8192).batches(str(parquet), "train"))
            data = TokenFile(arrow)
            dataset = datasets.Dataset.from_dict({"text": texts, "label": labels.tolist()}).map(
                lambda b: tokenizer(b["text"], truncation=True, max_length=128), batched=True,
                remove_columns=["text"])
            if step_mode:
                if batch == 32:
                    results["profile"] = profile_steps(data, arrow, tokenizer.pad_token_id)
                else:
                    results["pad_multiple"] = pad_multiple_ab(data, arrow, tokenizer.pad_token_id,
                                                              sampler, device_name)
                continue
            model_fn = model_factory(model_kind)
            case = f"{model_kind}_b{batch}"
            runs = {"wellfed": [], "trainer_grouped": []}
            tt.train_wellfed(data, arrow, tokenizer.pad_token_id, model_fn=model_fn, device="cuda",
                             precision="bf16", batch=batch, micro_tokens=micro_tokens,
                             lr=LR_FOR_BATCH[batch])  # warm-up, untimed
            for n, name in enumerate(ORDER, 1):
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                lr = LR_FOR_BATCH[batch]
                if name == "wellfed":
                    record, model = tt.train_wellfed(data, arrow, tokenizer.pad_token_id,
                                                     model_fn=model_fn, device="cuda",
                                                     precision="bf16", batch=batch,
                                                     micro_tokens=micro_tokens, lr=lr, sampler=sampler)
                else:
                    record, model, _ = tt.train_hf(dataset, tokenizer, True, str(tmp / f"hf_{n}"),
                                                   model_fn=model_fn, cuda=True, batch=batch, lr=lr,
                                                   sampler=sampler)
                rows_per_step(record, batch)
                record.update(gpu_figures(model, record, sampler, device_name))
                record.pop("cpu_share", None)  # a CPU-contention guard; meaningless here
                del model
                runs[name].append(record)
                print(f"[bench] gpu: {case} run {n}/{len(ORDER)} {name}: "
                      f"{record['real_tokens_per_s']:,.0f} real tok/s, {record['samples_per_s']:,.0f} "
                      f"samples/s, MFU {record['mfu_vs_table']}, padding {record['padding_efficiency']:.3f}, "
                      f"mem {record['peak_memory_gb']} GB, util {record['gpu_util_pct_mean']}%, "
                      f"loss(last 20%) {record['loss_last_20pct']:.3f}", flush=True)
            pooled = {name: {"real_tokens_per_s": round(sum(r["timed_real_tokens"] for r in rs)
                                                        / sum(r["timed_seconds"] for r in rs), 1),
                             "runs": rs} for name, rs in runs.items()}
            ratio = (pooled["wellfed"]["real_tokens_per_s"]
                     / pooled["trainer_grouped"]["real_tokens_per_s"])
            results[case] = {"model": model_kind, "global_batch": batch, "rows": len(pick),
                             "wellfed_micro_batch_tokens": micro_tokens, "lr": LR_FOR_BATCH[batch],
                             "wellfed_vs_trainer_grouped": round(ratio, 3), "contenders": pooled}
            print(f"[bench] gpu: {case}: wellfed / Trainer(group_by_length) = {ratio:.3f}", flush=True)
    sampler.stop()
    if not step_mode:
        harness.write_result(NAME, {
            "what": "fine-tuning throughput on one GPU, bf16, real (non-pad) tokens/s, wellfed vs "
                    "HF Trainer with group_by_length; random-init models, SST-2 rows",
            "device": device_name, "cases": results,
            "machine": harness.machine(), **clock.summary()}, folder=OUT)
        return
    harness.write_result("gpu_step", {
        "what": "inside wellfed's training step on one GPU (BERT-base-sized, bf16): profile, "
                "host/device syncs, pad multiple 8 vs 1", "device": device_name, **results,
        "machine": harness.machine(), **clock.summary()}, folder=OUT)
    profile = results["profile"]
    print(f"[bench] gpu step (BERT-base, batch 32): {profile['unprofiled_ms_per_step']} ms/step "
          f"unprofiled, {profile['syncs_per_step']} syncs/step, {profile['kernels_per_step']} kernels/step")
    for group, row in profile["breakdown"].items():
        print(f"  {group:36s} {row['ms_per_step']:8.3f} ms  {row['share_of_wall']:.1%}")
    for source, count in profile["sync_sources"].items():
        print(f"  sync x{count}: {source}")


def kept_auto_figures() -> dict:
    """The auto figures the last gpu_autobatch.json holds, stamped with their own device and
    machine (the file's top-level ones will describe the compile run)."""
    try:
        old = json.loads((OUT / "gpu_autobatch.json").read_text())
        auto = old["auto_b256"]
    except (OSError, ValueError, KeyError):
        sys.exit(f"[bench] no auto figures in {OUT / 'gpu_autobatch.json'} to keep: run "
                 "`python benchmarks/gpu_throughput.py auto` (both parts)")
    auto.setdefault("measured_on", {"device": old.get("device"), "machine": old.get("machine")})
    return {"auto_b256": auto}


def main_auto(compile_only: bool = False) -> None:
    """`auto` mode: single process, no Ray/MLflow/DVC, no HF Trainer (so no `datasets`).
    `compile` mode: its compile part alone, keeping the auto figures gpu_autobatch.json has."""
    harness.require_sst2(NAME)
    clock = harness.Clock()
    _, device_name, texts_all, labels_all, tokenizer, sampler = cuda_session()

    def save(results: dict) -> None:
        harness.write_result("gpu_autobatch", {
            "what": "BERT-base-sized, bf16, wellfed's own step: micro_batch_tokens auto at "
                    "global batch 256 (budget found, setup seconds incl. the probe, real "
                    "tokens/s, peak memory), and train.compile off vs on at batch 32 and 256 "
                    "(A B B A after a warm-up run of each)", "device": device_name, **results,
            "machine": harness.machine(), **clock.summary()}, folder=OUT)

    with tempfile.TemporaryDirectory() as tmp:
        kept = None
        if compile_only:
            kept = kept_auto_figures()
        autobatch_and_compile(texts_all, labels_all, tokenizer, Path(tmp), sampler, device_name,
                              save, kept)
    sampler.stop()


if __name__ == "__main__":
    main()
