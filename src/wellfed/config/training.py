"""`model`, `train` and `data`: what is trained, the recipe, and how workers are fed."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from wellfed.config.numbers import number


@dataclass(frozen=True)
class ModelConfig:
    """`model`: which pretrained encoder or decoder to fine-tune, fully or with LoRA."""

    name: str = "default"
    """"default" (all-MiniLM-L6-v2 packaged offline), a local model directory, or a Hub model id."""
    init: Literal["pretrained", "random"] = "pretrained"
    """pretrained loads the weights; random builds the architecture from its config (tests, ablations)."""
    trust_remote_code: bool = False
    """Allow a Hub model to run its own Python code. Off: only enable for code you have read."""
    lora_r: int = 0
    """LoRA rank: 0 = full fine-tuning; 8-16 trains adapters of rank r on `lora_targets` plus the
    classification head, every other weight frozen (peft). The exported model is merged."""
    lora_alpha: int = 16
    """LoRA scale numerator: adapter updates are multiplied by lora_alpha / lora_r."""
    lora_dropout: float = 0.05
    """Dropout on the adapters' input, in [0, 1)."""
    lora_targets: str = "auto"
    """Modules that get adapters: auto = peft's default for the architecture (q_proj,v_proj for
    Llama, c_attn for GPT-2, query,value for BERT), else comma-separated module names."""

    def target_modules(self) -> list[str] | None:
        """`lora_targets` as peft takes it: None for auto, else the list of names."""
        if self.lora_targets == "auto":
            return None
        return [t.strip() for t in self.lora_targets.split(",") if t.strip()]

    def problems(self) -> list[str]:
        out = []
        if not 0 <= self.lora_r <= 4096:
            out.append(f"model.lora_r must be in [0, 4096] (0 = full fine-tuning); got {self.lora_r}")
        if self.lora_alpha < 1:
            out.append(f"model.lora_alpha must be >= 1; got {self.lora_alpha}")
        if not 0 <= self.lora_dropout < 1:
            out.append(f"model.lora_dropout must be in [0, 1); got {self.lora_dropout}")
        targets = self.target_modules()
        if targets is not None and (not targets or not all(re.fullmatch(r"[\w.]+", t)
                                                           for t in targets)):
            out.append(f"model.lora_targets must be auto or comma-separated module names like "
                       f"q_proj,v_proj; got {self.lora_targets!r}")
        return out


@dataclass(frozen=True)
class TrainConfig:
    """`train`: the optimisation recipe, independent of how many workers run it."""

    epochs: int = 2
    """Passes over the train split."""
    max_steps: int = 0
    """Stop after this many optimizer steps (0 = run all epochs)."""
    lr: float = 1e-4
    """Peak AdamW learning rate, reached after warmup."""
    weight_decay: float = 0.01
    """AdamW weight decay (not applied to biases and LayerNorm weights)."""
    warmup_ratio: float = 0.06
    """Share of all optimizer steps spent warming the learning rate up linearly from 0."""
    global_batch_size: int = 32
    """Rows per optimizer step summed over all workers; the loss is normalised over exactly these rows."""
    micro_batch_size: int = 32
    """Most rows one worker puts through one forward pass; the rest is gradient accumulation."""
    micro_batch_tokens: int | str = 0
    """Most tokens (padding included) in one forward pass; 0 = bound by rows only. auto = on a
    GPU, the most that fits with headroom, found by a probe before training at the longest row
    (train/step/autobatch.py; the smallest over workers); on CPU, 0. Whatever is set, a CUDA
    out-of-memory error in a step halves the budget and redoes the step (one worker only)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping)."""
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    """auto = bf16 on GPUs that have it, fp16 + GradScaler on older GPUs, fp32 on CPU."""
    pad_multiple: int = 0
    """Pad sequence length to a multiple of this; 0 = per device (8 on CUDA for tensor cores, 1 on CPU)."""
    eval_every: int = 50
    """Evaluate on the validation split every N optimizer steps (0 = only at the end)."""
    report_every: int = 10
    """Send metrics to the driver every N optimizer steps (on Ray Train a report waits until the
    controller has taken the one before it: up to its 0.2 s poll, docs/scale-out.md)."""
    checkpoint_every: int = 100
    """Save a resumable checkpoint every N optimizer steps (0 = only at the end)."""
    seed: int = 42
    """Seed of model head init, shuffling and dropout."""
    pool_batches: int = 64
    """Length bucketing: rows are sorted by length inside pools of this many global batches."""
    profile_steps: str = ""
    """"A-B" captures a torch.profiler trace of optimizer steps A..B on rank 0 ("" = off)."""
    max_bad_steps: int = 0
    """Stop after this many consecutive non-finite losses (0 = never); fp16 overflow steps the
    GradScaler skips are counted, not fatal."""
    class_weights: str | dict = "none"
    """Loss weights for imbalanced labels: none, balanced (n / (classes x count): rare classes
    weigh more; multi-label: positive weight negatives/positives per label), or {label: weight}
    (single-label: that class's weight, default 1; multi-label: its positive weight)."""
    threshold: float | str = 0.5
    """Multi-label: a label is predicted when its probability reaches this; "tune" = the
    threshold with the best validation macro-F1 (0.05 to 0.95), recorded with the model."""
    select: Literal["best", "last"] = "best"
    """Which checkpoint becomes the exported model: best = the validation with the best
    `select_metric` (a new best is always checkpointed), last = the final step."""
    select_metric: str = "auto"
    """The validation figure that ranks checkpoints and drives early stopping: auto = the task's
    headline (val/macro_f1 for single- and multi-label, val/pearson for regression), or any val/*
    figure the task reports (e.g. val/loss); val/loss and val/mse are lower-is-better."""
    early_stopping_patience: int = 0
    """Stop after this many validations in a row without a strict improvement of
    `select_metric` (0 = never); the stop step is checkpointed and the run ends normally."""
    compile: bool = False
    """Run the training step's forward and backward through torch.compile (after the DDP wrap);
    validation and the exported model use the plain module. Shapes vary with the bucketed
    batches: the pad multiple keeps the widths few, and torch's automatic dynamic shapes compile
    one shape-generic graph after the first shape change instead of one graph per shape (the
    attention mask is always passed, so unpadded batches reuse it). H100, BERT-base, bf16:
    1.38x real tokens/s at batch 32 and 1.27x at 256; a fresh process compiled for 84 s."""
    cuda_graphs: Literal["auto", "true", "false"] = "auto"
    """auto = on a CUDA GPU, every micro-batch is padded to one of a few planned shapes
    (max_shapes) and each shape's forward + backward, and the update, are replayed as CUDA
    graphs (captured at their second use; a capture error falls back to the same shapes run
    eagerly); with several workers the update's graph begins with the gradient all-reduce (no
    DDP on this path); off on CPU and under train.compile. true = the same, and on a CPU the
    shape plan runs eagerly; false = per-batch widths, eager, DDP under several workers."""
    max_shapes: int = 16
    """Most (rows, width) shapes of the CUDA graph path, widths chosen from the train lengths to
    pad least: SST-2's train split computes 0.84 real tokens per token with 8, 0.92 with 16."""
    calibrate: Literal["auto", "temperature", "none"] = "auto"
    """Post-hoc calibration of the scores (wellfed/evaluate/temperature.py): after training, temperature
    scaling is fitted on the validation split (multi-label: per-label temperatures when they
    measure better) and folded into the exported model's head, so evaluate, predict, the served
    model and `pipeline()` all give calibrated scores; `wellfed.json` records it. temperature =
    always; auto = when it lowers validation ECE, changes no prediction (temperature scaling
    cannot change a row's arg-max) and did not run to its bound (the line says what the model
    did: barely trained, or every validation row already right),
    said in one line with the ECE before and after; none = no fit (no validation pass). Neither
    fits on a validation split of one class (wellfed/data/coverage.py). Regression: not
    applicable."""
    keep_checkpoints: int | str = "all"
    """Checkpoints kept while the run trains: all, or the N newest plus the best (train.select:
    best); the newest always stays, a resume starts from it. Once the run completes, only the
    exported one stays, without optimizer state, its weights hard links to the MLflow model's
    files where both are on one local filesystem (train/checkpoints/store.py). Not part of the run's
    identity: changing it resumes an interrupted run."""

    def profile_range(self) -> tuple[int, int] | None:
        if not self.profile_steps:
            return None
        first, _, last = self.profile_steps.partition("-")
        return int(first), int(last or first)

    def problems(self) -> list[str]:
        out = []
        positive = {"epochs": self.epochs, "global_batch_size": self.global_batch_size,
                    "micro_batch_size": self.micro_batch_size, "report_every": self.report_every,
                    "pool_batches": self.pool_batches}
        out += [f"train.{k} must be >= 1; got {v}" for k, v in positive.items() if v < 1]
        non_negative = {"max_steps": self.max_steps,
                        "eval_every": self.eval_every, "checkpoint_every": self.checkpoint_every,
                        "pad_multiple": self.pad_multiple, "weight_decay": self.weight_decay,
                        "max_grad_norm": self.max_grad_norm}
        out += [f"train.{k} must be >= 0; got {v}" for k, v in non_negative.items() if v < 0]
        tokens = self.micro_batch_tokens
        count = None if tokens == "auto" else number(tokens, integer=True)
        if tokens != "auto" and (count is None or count < 0):
            out.append(f"train.micro_batch_tokens must be an integer >= 0 (0 = rows only) or "
                       f"auto (the most that fits on the GPU); got {tokens!r}")
        if not (0 < self.lr < 1):
            out.append(f"train.lr must be in (0, 1); got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            out.append(f"train.warmup_ratio must be in [0, 1); got {self.warmup_ratio}")
        if self.profile_steps:
            try:
                first, last = self.profile_range()
                if not 1 <= first <= last:
                    raise ValueError
            except ValueError:
                out.append(f"train.profile_steps must look like '10-12' (1-based, first <= last) "
                           f"or ''; got {self.profile_steps!r}")
        if self.max_shapes < 1:
            out.append(f"train.max_shapes must be >= 1; got {self.max_shapes}")
        if self.cuda_graphs == "true" and self.compile:
            out.append("train.cuda_graphs true and train.compile true: choose one (compile "
                       "shapes its own graphs); set cuda_graphs: auto or compile: false")
        if self.max_bad_steps < 0:
            out.append(f"train.max_bad_steps must be >= 0; got {self.max_bad_steps}")
        if isinstance(self.class_weights, dict):
            bad = {k: v for k, v in self.class_weights.items()
                   if (number(v) is None or number(v) <= 0)}
            if bad:
                key, value = next(iter(bad.items()))
                out.append(f"train.class_weights[{key!r}] must be a positive number; got {value!r}")
        elif self.class_weights not in ("none", "balanced"):
            out.append("train.class_weights must be none, balanced or a {label: weight} mapping; "
                       f"got {self.class_weights!r}")
        if self.threshold != "tune" and not (number(self.threshold) is not None
                                             and 0 < number(self.threshold) < 1):
            out.append(f"train.threshold must be in (0, 1) or tune; got {self.threshold!r}")
        keep = number(self.keep_checkpoints, integer=True)
        if self.keep_checkpoints != "all" and (keep is None or keep < 1):
            out.append(f"train.keep_checkpoints must be all or an integer >= 1; got "
                       f"{self.keep_checkpoints!r}")
        if self.early_stopping_patience < 0:
            out.append(f"train.early_stopping_patience must be >= 0 (0 = off); got "
                       f"{self.early_stopping_patience}")
        elif self.early_stopping_patience and not self.eval_every:
            out.append("train.early_stopping_patience needs periodic validations; set "
                       "train.eval_every > 0 or early_stopping_patience: 0")
        if self.select_metric != "auto" and not self.select_metric.startswith("val/"):
            out.append(f"train.select_metric must be auto or a validation figure like "
                       f"val/macro_f1 or val/loss; got {self.select_metric!r}")
        return out

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-steps per optimizer step when micro-batches are full (token budgets may add more)."""
        return max(1, math.ceil(self.global_batch_size / (world_size * self.micro_batch_size)))


@dataclass(frozen=True)
class DataConfig:
    """`data`: how workers feed the device from the token files."""

    loader_workers: int = 0
    """Background loader processes per worker (0 = gather in the training process; gathering a
    batch takes ~0.1 ms here, so extra processes only pay off with a very fast device)."""
    prefetch: int = 2
    """Micro-batches each loader process prepares ahead (only with loader_workers > 0)."""

    def problems(self) -> list[str]:
        out = []
        if not 0 <= self.loader_workers <= 64:
            out.append(f"data.loader_workers must be in [0, 64]; got {self.loader_workers}")
        if self.prefetch < 1:
            out.append(f"data.prefetch must be >= 1; got {self.prefetch}")
        return out


