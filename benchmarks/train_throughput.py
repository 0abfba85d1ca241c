"""Training throughput: wellfed's step vs Hugging Face Trainer, same rows, same recipe, CPU fp32.

All three fine-tune all-MiniLM-L6-v2 (same pretrained weights, same seeded head) for one epoch
over the same 2,048 SST-2 train rows (a seeded sample) at global batch 32 (64 optimizer steps),
AdamW lr 1e-4, weight decay 0.01, linear warmup 6% then decay, clip 1.0, 2 torch threads:
  wellfed          TokenFile + iterate_steps (pool_batches 64, world 1, pad_multiple 1) fed to
                   wellfed.train.step.loop's own setup, micro_batches and train_step (what
                   loop.train runs on every worker), in-process without Ray
  trainer_default  Trainer, its default RandomSampler + DataCollatorWithPadding
  trainer_grouped  Trainer with length grouping (LengthGroupedSampler)
Throughput = real (non-pad) tokens / s, timed from the end of the first optimizer step to the end
of the last (model load, tokenization and the first step's warm-up are outside), counting the
tokens of the timed steps. Runs go in the order A B C C B A A C C A so drift on this noisy
2-core machine does not favour one side; each contender's throughput pools its runs, and each
ratio also carries its range over runs (slowest ours / fastest theirs .. the reverse). Each run
records its CPU share (process CPU time / (wall x 2 threads)); a run under 0.85 was crowded out
by other processes and is run again (kept in the JSON as discarded), at most twice.
So nobody wins by learning less: mean training loss over the last 20% of steps, and SST-2 dev
accuracy after training (outside the timing), per contender.
Targets: wellfed >= 2.2x trainer_default and >= 1.1x trainer_grouped.

usage: python benchmarks/train_throughput.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

import harness

NAME = "train_throughput"
ROWS = 2048
BATCH = 32
SEED = 42
LR, WEIGHT_DECAY, WARMUP, CLIP = 1e-4, 0.01, 0.06, 1.0
# A B C C B A, then A C C A: the close contest (vs grouped) gets 4 runs a side. Runs take ~20 s
# (wellfed, grouped) and ~45 s (default) here, ~5 min in all with model loads and dev evals.
ORDER = ("wellfed", "trainer_default", "trainer_grouped", "trainer_grouped", "trainer_default",
         "wellfed", "wellfed", "trainer_grouped", "trainer_grouped", "wellfed")
TARGETS = {"trainer_default": 2.2, "trainer_grouped": 1.1}
CONTENDED = 0.85  # a run whose process got under 85% of its 2 threads' CPU time was crowded out
RETRIES = 2  # ... and is run again, at most twice, while the benchmark is under RETRY_UNTIL_S
RETRY_UNTIL_S = 420


def fresh_model():
    import torch
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the missing classifier head is expected
    torch.manual_seed(SEED)  # the same head init for every contender
    return AutoModelForSequenceClassification.from_pretrained(harness.model_path(), num_labels=2)


def stamp(sync: bool = False) -> tuple[float, float]:
    """(wall, this process's CPU time over all its threads) after an optimizer step; `sync` waits
    for the GPU first (only at the ends of the timed window, so the steps in between run async)."""
    if sync:
        import torch

        torch.cuda.synchronize()
    return time.perf_counter(), time.process_time()


def run_record(stamps, losses, counts) -> dict:
    """Throughput over steps 2..N (timed window), padding and loss over all steps."""
    (wall0, cpu0), (wall1, cpu1) = stamps[0], stamps[-1]
    real = np.array([c[0] for c in counts], np.int64)
    padded = np.array([c[1] for c in counts], np.int64)
    losses = np.asarray(losses, np.float64)
    tail = losses[int(0.8 * len(losses)):]
    seconds = wall1 - wall0
    # CPU share < ~0.85 means other processes took cores from this run: its speed is not its own.
    cpu_share = (cpu1 - cpu0) / (seconds * harness.THREADS)
    return {"steps": len(stamps), "timed_seconds": round(seconds, 3), "cpu_share": round(cpu_share, 3),
            "timed_real_tokens": int(real[1:].sum()), "timed_padded_tokens": int(padded[1:].sum()),
            "real_tokens_per_s": round(real[1:].sum() / seconds, 1),
            "padding_efficiency": round(real.sum() / padded.sum(), 4),
            "loss_last_20pct": round(float(tail.mean()), 4), "loss_first_step": round(float(losses[0]), 4)}


def train_wellfed(data, path: Path, pad_id, *, model_fn=None, device: str = "cpu",
                  precision: str = "fp32", batch: int = BATCH, micro_tokens: int = 0,
                  lr: float = LR, pad_multiple: int = 0, sampler=None) -> tuple[dict, object]:
    """The loop's own `setup` and `train_step`, single process, world 1 (CPU fp32 here;
    benchmarks/gpu_throughput.py passes a CUDA device, bf16, larger batches)."""
    import torch
    from wellfed.config import TrainConfig
    from wellfed.data.batching import iterate_steps
    from wellfed.telemetry.meter import StepMeter
    from wellfed.telemetry.peak import device_peak
    from wellfed.train.step.feeding import micro_batches
    from wellfed.train.step.setup import setup
    from wellfed.train.step.step import train_step
    from wellfed import device as dev

    cfg = TrainConfig(epochs=1, lr=lr, weight_decay=WEIGHT_DECAY, warmup_ratio=WARMUP,
                      global_batch_size=batch, micro_batch_size=batch, micro_batch_tokens=micro_tokens,
                      max_grad_norm=CLIP, precision=precision, seed=SEED, pool_batches=64,
                      pad_multiple=pad_multiple)
    device = torch.device(device)
    cuda = device.type == "cuda"
    s = setup(cfg, (model_fn or fresh_model)().to(device), len(data), device,
              lengths=data.lengths)
    steps = s.steps
    torch.manual_seed(cfg.seed)  # dropout
    meter = StepMeter(device, device_peak(device, dev.device_name(device), s.precision.name,
                                          s.precision.dtype), s.model.config)
    plan = iterate_steps(data.lengths, s.spec, 0, 0, 0, cfg.epochs)
    fed = micro_batches(plan, data, path, pad_id, s.spec, loader_workers=0,
                        prefetch=2, pin=cuda)
    stamps, values, counts = [], [], []
    for step, batches in fed:
        values.append(train_step(s, step, batches, meter, data.lengths))
        stamps.append(stamp(sync=cuda and (len(stamps) == 0 or len(stamps) == steps - 1)))
        counts.append((step.real_tokens, step.padded_tokens))
        if len(stamps) == 1:
            meter.reset()  # its interval then matches the timed window: steps 2..N
            if sampler:
                sampler.snapshot()  # NVML means over the timed window only
    record = run_record(stamps, [float(v.loss) for v in values], counts)
    interval = meter.interval()
    record["meter"] = {"input_wait_share": round(interval["input_wait_share"], 4),
                       "copy_s": round(interval["copy_s"], 4),
                       "compute_s": round(interval["compute_s"], 4),
                       "interval_s": round(interval["interval_s"], 4),
                       "mfu": round(interval["mfu"], 4), "peak_source": meter.peak.source,
                       "precision": s.precision.name, "pad_multiple": s.spec.pad_multiple}
    return record, s.model


def grouping_args(arguments_cls) -> dict:
    """transformers 5.x replaced `group_by_length=True` with train_sampling_strategy."""
    if "train_sampling_strategy" in arguments_cls.__dataclass_fields__:
        return {"train_sampling_strategy": "group_by_length"}
    return {"group_by_length": True}


def train_hf(dataset, tokenizer, grouped: bool, out_dir: str, *, model_fn=None, cuda: bool = False,
             batch: int = BATCH, lr: float = LR, sampler=None, seed: int = SEED
             ) -> tuple[dict, object, dict]:
    """HF Trainer on the same rows; on CUDA in bf16 with pinned-memory loading (its defaults),
    logging every 50 steps there (a log forces a device sync) and every step on CPU."""
    from transformers import (DataCollatorWithPadding, PrinterCallback, Trainer, TrainerCallback,
                              TrainingArguments)

    pad = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if cuda else None)
    counts, stamps, losses = [], [], []

    def collate(features):  # counts what the model is fed: real vs padded tokens per batch
        batch = pad(features)
        counts.append((int(batch["attention_mask"].sum()), batch["input_ids"].numel()))
        return batch

    class Stamps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            first = state.global_step == 1
            stamps.append(stamp(sync=cuda and (first or state.global_step == state.max_steps)))
            if first and sampler:
                sampler.snapshot()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    fields = TrainingArguments.__dataclass_fields__
    warmup = {"warmup_ratio": WARMUP} if "warmup_ratio" in fields else {"warmup_steps": WARMUP}
    grouping = grouping_args(TrainingArguments) if grouped else {}
    device = {"bf16": True, "dataloader_pin_memory": True} if cuda else {
        "use_cpu": True, "dataloader_pin_memory": False}
    args = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=batch, num_train_epochs=1,
        learning_rate=lr, weight_decay=WEIGHT_DECAY, lr_scheduler_type="linear", max_grad_norm=CLIP,
        seed=seed, report_to="none", save_strategy="no", eval_strategy="no",
        logging_strategy="steps", logging_steps=50 if cuda else 1, disable_tqdm=True,
        dataloader_num_workers=0, **device, **warmup, **grouping)
    trainer = Trainer(model=(model_fn or fresh_model)(), args=args, train_dataset=dataset,
                      processing_class=tokenizer, data_collator=collate, callbacks=[Stamps()])
    trainer.remove_callback(PrinterCallback)  # one printed dict per step otherwise
    trainer.train()
    if len(counts) != len(stamps):
        raise RuntimeError(f"collator saw {len(counts)} batches for {len(stamps)} steps")
    setup = {"optimizer": str(args.optim), "sampling": grouping or "RandomSampler (default)",
             "warmup": warmup}
    return run_record(stamps, losses, counts), trainer.model, setup


def dev_accuracy(model, dev_data, pad_id) -> float:
    """SST-2 dev accuracy, the same sorted batches for every contender (outside the timing)."""
    import torch

    model.eval()
    order = np.argsort(dev_data.lengths, kind="stable")
    correct = 0
    with torch.no_grad():
        for start in range(0, len(order), 128):
            batch = {k: torch.from_numpy(v) for k, v in dev_data.gather(order[start:start + 128], pad_id).items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            correct += int((logits.argmax(-1) == batch["labels"]).sum())
    return correct / len(order)


def run_one(name: str, data, dataset, dev_data, tokenizer, scratch: Path) -> tuple[dict, dict]:
    """One training run of one contender, then its dev accuracy (outside the timing)."""
    import torch

    torch.set_num_threads(harness.THREADS)
    if name == "wellfed":
        record, model = train_wellfed(data, data.path, tokenizer.pad_token_id)
        setup = {"optimizer": "torch.optim.AdamW (wellfed.train.step.loop.setup)",
                 "sampling": "wellfed iterate_steps, pool_batches 64",
                 "step": "wellfed.train.step.loop.train_step, loader_workers 0"}
    else:
        record, model, setup = train_hf(dataset, tokenizer, name == "trainer_grouped", str(scratch))
    record["dev_accuracy"] = round(dev_accuracy(model, dev_data, tokenizer.pad_token_id), 4)
    return record, setup


def pooled(runs: list[dict]) -> dict:
    tokens = sum(r["timed_real_tokens"] for r in runs)
    seconds = sum(r["timed_seconds"] for r in runs)
    padded = sum(r["timed_padded_tokens"] for r in runs)
    return {"real_tokens_per_s": round(tokens / seconds, 1),
            "min_cpu_share": min(r["cpu_share"] for r in runs),
            "padding_efficiency": round(np.mean([r["padding_efficiency"] for r in runs]), 4),
            "timed_padding_efficiency": round(tokens / padded, 4),
            "loss_last_20pct": round(float(np.mean([r["loss_last_20pct"] for r in runs])), 4),
            "dev_accuracy": round(float(np.mean([r["dev_accuracy"] for r in runs])), 4),
            "runs": runs}


def main() -> None:
    harness.require_sst2(NAME)
    clock = harness.Clock()
    import datasets
    import torch
    from transformers import AutoTokenizer
    from wellfed.data.token_files import TokenFile, write_token_file
    from wellfed.data.tokenization import SplitTokenizer

    torch.set_num_threads(harness.THREADS)
    datasets.disable_progress_bars()
    texts, labels = harness.read_sst2("train")
    pick = np.sort(np.random.default_rng(SEED).choice(len(texts), ROWS, replace=False))
    texts, labels = [texts[i] for i in pick], labels[pick]
    dev_texts, dev_labels = harness.read_sst2("dev")
    tokenizer = AutoTokenizer.from_pretrained(harness.model_path())

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = {}
        for split, (t, y) in {"train": (texts, labels), "dev": (dev_texts, dev_labels)}.items():
            parquet = harness.write_parquet(tmp / f"{split}.parquet", t, y)
            write_token_file(tmp / f"{split}.arrow",
                             SplitTokenizer(tokenizer, 128, 8192).batches(str(parquet), split))
            files[split] = TokenFile(tmp / f"{split}.arrow")
        data, dev_data = files["train"], files["dev"]

        # Trainer's data: the usual recipe, Dataset.map over the same sampled texts.
        dataset = datasets.Dataset.from_dict({"text": texts, "label": labels.tolist()}).map(
            lambda b: tokenizer(b["text"], truncation=True, max_length=128), batched=True,
            remove_columns=["text"])
        same_rows = (len(dataset) == len(data)
                     and all(dataset[i]["input_ids"] == data.row(i).tolist() for i in range(len(data)))
                     and np.array_equal(np.asarray(dataset["label"]), data.labels))

        runs = {name: [] for name in dict.fromkeys(ORDER)}
        setups, crowded = {}, []
        for n, name in enumerate(ORDER, 1):
            for attempt in range(RETRIES + 1):
                record, setups[name] = run_one(name, data, dataset, dev_data, tokenizer, tmp / f"run_{n}")
                record["order"] = n
                print(f"[bench] train: run {n}/{len(ORDER)} {name}: {record['real_tokens_per_s']:,.0f} "
                      f"real tokens/s, padding {record['padding_efficiency']:.2f}, loss(last 20%) "
                      f"{record['loss_last_20pct']:.3f}, dev acc {record['dev_accuracy']:.3f}, "
                      f"cpu share {record['cpu_share']:.2f}", flush=True)
                if (record["cpu_share"] >= CONTENDED or attempt == RETRIES
                        or time.perf_counter() - clock.start > RETRY_UNTIL_S):
                    break
                crowded.append({"contender": name, **record})
                print(f"[bench] train: run {n} was crowded out by other processes; running it again")
            runs[name].append(record)

    contenders = {name: pooled(r) for name, r in runs.items()}
    ours = contenders["wellfed"]["real_tokens_per_s"]
    ratios = {}
    for name, target in TARGETS.items():
        ratios[f"wellfed_vs_{name}"] = harness.ratio(
            ours / contenders[name]["real_tokens_per_s"], target,
            of="wellfed real tokens/s", over=f"{name} real tokens/s")
        mine = [r["real_tokens_per_s"] for r in runs["wellfed"]]
        theirs = [r["real_tokens_per_s"] for r in runs[name]]
        ratios[f"wellfed_vs_{name}"]["range_over_runs"] = [round(min(mine) / max(theirs), 3),
                                                           round(max(mine) / min(theirs), 3)]
    harness.write_result(NAME, {
        "what": "fine-tuning throughput in real (non-pad) tokens/s, CPU fp32, global batch 32",
        "config": {"rows": ROWS, "sample_seed": SEED, "batch": BATCH, "steps": runs["wellfed"][0]["steps"],
                   "lr": LR, "weight_decay": WEIGHT_DECAY, "warmup_ratio": WARMUP, "max_grad_norm": CLIP,
                   "precision": "fp32", "threads": harness.THREADS, "order": list(ORDER),
                   "timed_window": "end of optimizer step 1 -> end of the last step",
                   "same_tokenized_rows": bool(same_rows), "contender_setup": setups,
                   "note": ("wellfed's pool of 64 global batches x 32 = 2,048 rows is the whole "
                            "sample here, so it is sorted as one pool (on full SST-2 it is one "
                            "pool per 2,048 rows too); the wellfed model is put in train mode "
                            "explicitly, as Trainer does")},
        "contenders": contenders, "ratios": ratios,
        "all_met": all(r["met"] for r in ratios.values()),
        "contended": min(c["min_cpu_share"] for c in contenders.values()) < CONTENDED,
        "crowded_out_runs_discarded": crowded,
        "machine": harness.machine(), **clock.summary()})


if __name__ == "__main__":
    main()
