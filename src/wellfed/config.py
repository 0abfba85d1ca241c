"""Typed configuration: one frozen dataclass per params.yaml section.

Every section is loaded with `load_section`, which collects *all* problems (unknown keys with a
"did you mean", wrong types, out-of-range values) and raises them once as a `ValueError`, so a
user fixes params.yaml in one go instead of one traceback at a time.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

@dataclass(frozen=True)
class PrepareConfig:
    """`prepare`: where the raw labelled text comes from, how it is read and how it is split."""

    train: str = "train.tsv"
    """Train file inside the raw folder (a dvc.yaml argument), or the split name with `hub_dataset`."""
    validation: str = "dev.tsv"
    """Validation file or split name; "" carves `val_fraction` of train, stratified and seeded."""
    test: str = "test.tsv"
    """Labelled test file or split name; "" evaluates on the validation split."""
    format: Literal["auto", "csv", "tsv", "jsonl", "parquet"] = "auto"
    """File format; auto = from the extension, else sniffed from the content (no extension)."""
    header: bool = True
    """CSV/TSV: line 1 names the columns; false = every line is data, columns go by position."""
    quoting: Literal["auto", "none", "csv"] = "auto"
    """CSV/TSV quotes: csv = RFC 4180 ("..." may hold delimiters, newlines, "" for a quote);
    none = quotes are plain characters (many TSV exports; GLUE's own loader reads its TSVs so);
    auto = csv unless the file only parses with quotes as plain characters."""
    text_column: str | int | list = "sentence"
    """Column holding the input text: its name, or its 0-based position (needed with header: false).
    A list of two columns is a sentence pair ([premise, hypothesis]), encoded as one input."""
    label_column: str | int | list = "label"
    """Column holding the label: a name or a 0-based position. Single-label: any strings or
    integers; multi-label: a list (JSONL/Parquet) or a `label_delimiter`-separated string;
    regression: numbers (a list of columns = several targets). A label in `missing_labels` is
    missing, handled by `on_invalid`."""
    missing_labels: list = dataclasses.field(default_factory=lambda: ["", "NaN", "null", "None"])
    """Label spellings that mean "this row has no label" (compared stripped, in any case),
    handled by `on_invalid` (error, or skip and count them per spelling in the data report).
    The whole list: keep the defaults when adding, e.g. SNLI's `-` (pairs without annotator
    agreement) and Hugging Face's `-1` (unlabelled rows): ["", "NaN", "null", "None", "-",
    "-1"]. A cell with no value at all is always missing. A label that looks like a marker and
    is not listed (`-`, `?`, `N/A`, `unknown`, ...; a punctuation character or a negative
    integer under 2% of train rows) gets one warning naming this key."""
    task: Literal["auto", "single_label", "multi_label", "regression"] = "auto"
    """What the labels are; auto = inferred from train's labels and said in one line: lists or
    delimited labels whose parts also occur alone -> multi_label, numbers that are not all
    integers -> regression, anything else -> single_label."""
    label_delimiter: str = ","
    """Multi-label in CSV/TSV: the character between a row's labels (`2,17`)."""
    hub_dataset: str = ""
    """Hugging Face Hub dataset id (needs network); when set the raw folder is not read."""
    hub_config: str = ""
    """Hub dataset configuration name, e.g. sst2 for nyu-mll/glue."""
    val_fraction: float = 0.1
    """Share of train carved out as validation when `validation` is ""; a text and its
    duplicates always land on the same side."""
    seed: int = 42
    """Seed of the validation carve-out."""
    drop_duplicates: bool = False
    """Drop repeated (text, label) rows inside a split; they are counted in the report either way."""
    on_invalid: Literal["error", "skip"] = "error"
    """What to do with an empty text or a missing label: stop with the row named, or skip and count it."""
    on_conflict: Literal["error", "keep", "drop"] = "keep"
    """The same text with different labels in one split: stop with the rows named, keep the rows
    (counted and warned about), or drop every such row."""

    def problems(self) -> list[str]:
        out = []
        if not 0.0 < self.val_fraction < 0.5:
            out.append(f"prepare.val_fraction must be in (0, 0.5); got {self.val_fraction}")
        if not self.train:
            out.append("prepare.train must name the train file (or hub split); got ''")
        for key, most in (("text_column", 2), ("label_column", 64)):
            value = getattr(self, key)
            listed = value if isinstance(value, list) else [value]
            if isinstance(value, list) and not 1 <= len(value) <= most:
                out.append(f"prepare.{key} lists {len(value)} columns; give 1 to {most}"
                           + (" (two = a sentence pair)" if key == "text_column" else ""))
            for one in listed:
                if isinstance(one, bool) or not isinstance(one, (str, int)):
                    out.append(f"prepare.{key} must be a column name or a 0-based column "
                               f"position (or a list of them); got {one!r}")
                elif isinstance(one, int) and one < 0:
                    out.append(f"prepare.{key} must be a 0-based column position (>= 0); got {one}")
                elif one == "":
                    out.append(f"prepare.{key} must name a column; got ''")
        shared = {str(c) for c in self.text_columns()} & {str(c) for c in self.label_columns()}
        if shared:
            out.append(f"prepare.text_column and prepare.label_column must be different columns; "
                       f"both name {sorted(shared)[0]!r}")
        if len(self.label_columns()) > 1 and self.task not in ("auto", "regression"):
            out.append(f"prepare.label_column lists several columns, which only a regression "
                       f"(several targets) can use; got task {self.task}")
        if not isinstance(self.missing_labels, list) or not all(
                entry is None or (isinstance(entry, (str, int, float))
                                  and not isinstance(entry, bool))
                for entry in self.missing_labels):
            out.append(f"prepare.missing_labels must be a list of label spellings, e.g. "
                       f'["", "NaN", "null", "None", "-"] (quote words YAML reads as true or '
                       f'false, like "no"); got {self.missing_labels!r}')
        if len(self.label_delimiter) != 1 or self.label_delimiter.isspace():
            out.append(f"prepare.label_delimiter must be one visible character; got "
                       f"{self.label_delimiter!r}")
        return out

    def text_columns(self) -> list:
        """The text column(s): one, or two for a sentence pair."""
        return list(self.text_column) if isinstance(self.text_column, list) else [self.text_column]

    def label_columns(self) -> list:
        """The label column(s): one, or several regression targets."""
        return (list(self.label_column) if isinstance(self.label_column, list)
                else [self.label_column])


@dataclass(frozen=True)
class TokenizeConfig:
    """`tokenize`: the one-off tokenizer pass into memory-mapped Arrow."""

    max_length: int = 128
    """Truncate rows to this many tokens (special tokens included); truncations are counted."""
    batch_rows: int = 8192
    """Rows per tokenizer call; bounds the stage's memory, not its output."""

    def problems(self) -> list[str]:
        out = []
        if not 8 <= self.max_length <= 65536:
            out.append(f"tokenize.max_length must be in [8, 65536]; got {self.max_length}")
        if self.batch_rows < 1:
            out.append(f"tokenize.batch_rows must be >= 1; got {self.batch_rows}")
        return out


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
    (train/autobatch.py; the smallest over workers); on CPU, 0. Whatever is set, a CUDA
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
    """Send metrics to the driver every N optimizer steps (each report can wait ~2 s on Ray's poll)."""
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
    """auto = on a CUDA GPU with one worker, every micro-batch is padded to one of a few planned
    shapes (max_shapes) and each shape's forward + backward, and the update, are replayed as
    CUDA graphs (captured at their second use; a capture error falls back to the same shapes
    run eagerly); off on CPU, under train.compile, and eager-with-shapes under DDP. true = the
    same, and on a CPU the shape plan runs eagerly; false = per-batch widths, eager."""
    max_shapes: int = 16
    """Most (rows, width) shapes of the CUDA graph path, widths chosen from the train lengths to
    pad least: SST-2's train split computes 0.84 real tokens per token with 8, 0.92 with 16."""
    calibrate: Literal["auto", "temperature", "none"] = "auto"
    """Post-hoc calibration of the scores (wellfed/temperature.py): after training, temperature
    scaling is fitted on the validation split (multi-label: per-label temperatures when they
    measure better) and folded into the exported model's head, so evaluate, predict, the served
    model and `pipeline()` all give calibrated scores; `wellfed.json` records it. temperature =
    always; auto = when it lowers validation ECE and changes no prediction (temperature scaling
    cannot change a row's arg-max), said in one line with the ECE before and after; none = no
    fit (no validation pass). Regression: not applicable."""
    keep_checkpoints: int | str = "all"
    """Checkpoints kept while the run trains: all, or the N newest plus the best (train.select:
    best); the newest always stays, a resume starts from it. Once the run completes, only the
    exported one stays, without optimizer state, its weights hard links to the MLflow model's
    files where both are on one local filesystem (train/store.py). Not part of the run's
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


@dataclass(frozen=True)
class RayConfig:
    """`ray`: where and how wide the train stage runs."""

    address: str = ""
    """Ray cluster to join ("" = $RAY_ADDRESS if set, else a local Ray started for this run)."""
    num_workers: int = 1
    """Training workers (DDP ranks)."""
    cpus_per_worker: int = 2
    """CPU cores reserved per worker; also its torch thread count."""
    use_gpu: Literal["auto", "true", "false"] = "auto"
    """auto = one GPU per worker when the cluster has GPUs."""
    max_failures: int = 2
    """Worker-group restarts Ray may do from the last checkpoint before giving up."""
    storage_path: str = ""
    """Checkpoints (and, for multi-node runs, the token files) go here: "" = the train stage's
    checkpoint folder; set it to shared storage (NFS path, s3://...) for a multi-node cluster."""
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    """How Ray places workers: PACK fills a node first, SPREAD puts them on different nodes."""
    in_process: Literal["auto", "false"] = "auto"
    """auto = one worker and no cluster address trains in the stage's own process, without
    Ray Train's start and stop (train/local.py); false = always on Ray Train (worker restarts
    on failure: max_failures)."""

    def problems(self) -> list[str]:
        out = []
        if self.num_workers < 1:
            out.append(f"ray.num_workers must be >= 1; got {self.num_workers}")
        if self.cpus_per_worker < 1:
            out.append(f"ray.cpus_per_worker must be >= 1; got {self.cpus_per_worker}")
        if self.max_failures < -1:
            out.append(f"ray.max_failures must be >= -1 (-1 = unlimited); got {self.max_failures}")
        return out


@dataclass(frozen=True)
class MlflowConfig:
    """`mlflow`: where runs are recorded."""

    experiment: str = "wellfed"
    """Experiment name in the MLflow UI."""
    tracking_uri: str = ""
    """"" = $MLFLOW_TRACKING_URI if set, else sqlite:///<project>/mlflow.db (absolute: Ray workers run elsewhere)."""
    registered_model: str = ""
    """Model Registry name the trained model is registered under, a new version per run;
    "" = `<experiment>-classifier` (wellfed-classifier). MLflow forbids '/' and ':' in it."""
    champion_alias: str = "champion"
    """The registry alias (`models:/<name>@champion`) that evaluate moves to a new version only
    when its headline test figure (eval/macro_f1; regression eval/pearson) beats the alias
    holder's on the same split (same rows, texts and labels); "" = no alias is set."""

    def model_name(self) -> str:
        """The registered model name: `registered_model`, else derived from the experiment."""
        return self.registered_model or re.sub(r"[/:]", "-", self.experiment) + "-classifier"

    def problems(self) -> list[str]:
        out = []
        if re.search(r"[/:]", self.registered_model):
            out.append(f"mlflow.registered_model cannot contain '/' or ':' (MLflow model "
                       f"names); got {self.registered_model!r}: use '-' instead")
        alias = self.champion_alias
        # MLflow reserves `latest` and version-like names (v3), and takes [A-Za-z0-9_-] only.
        if alias and (not re.fullmatch(r"[A-Za-z0-9_-]{1,255}", alias)
                      or alias.lower() == "latest" or re.fullmatch(r"[vV]\d+", alias)):
            out.append(f"mlflow.champion_alias must be letters, digits, '_' or '-', not 'latest' "
                       f"nor a version like 'v3'; got {alias!r}: e.g. champion, or \"\" for none")
        return out


@dataclass(frozen=True)
class PredictConfig:
    """`predict`: the optional predict stages (`dvc repro predict`): the exported model's
    per-row predictions for unlabelled files."""

    inputs: dict[str, str] = dataclasses.field(default_factory=dict)
    """name -> an unlabelled file (any format prepare reads); each gets a stage `predict@name`
    writing data/predictions/<name>.parquet. {} = no predict stage at all (the default)."""
    text_column: str | int | list = ""
    """The inputs' text column: a name or a 0-based position, a list of two for a sentence pair;
    "" = the column(s) the model was trained on (its wellfed.json)."""
    format: Literal["auto", "csv", "tsv", "jsonl", "parquet"] = "auto"
    """File format; auto = from the extension, else sniffed from the content."""
    header: bool = True
    """CSV/TSV: line 1 names the columns; false = every line is data."""
    quoting: Literal["auto", "none", "csv"] = "auto"
    """CSV/TSV quotes, as prepare.quoting."""
    workers: int = 0
    """0 = predict in the stage's own process (one device); N = N Ray Data workers on the local
    Ray or the cluster ray.address / $RAY_ADDRESS names, one GPU each when it has GPUs."""
    chunk_rows: int = 8192
    """Rows per model pass: bounds memory (one chunk of predictions at a time) and keeps the
    length buckets full."""

    def text_columns(self) -> list:
        """The columns asked for as a list; [] = the model's own."""
        if isinstance(self.text_column, list):
            return list(self.text_column)
        return [] if self.text_column == "" else [self.text_column]

    def problems(self) -> list[str]:
        out = []
        if not isinstance(self.inputs, dict):
            out.append(f"predict.inputs must map names to files, e.g. {{reviews: new.csv}}; "
                       f"got {self.inputs!r}")
        else:
            for name, path in self.inputs.items():
                if not re.fullmatch(r"[A-Za-z0-9_-]+", str(name)):
                    out.append(f"predict.inputs name {name!r} names a stage and a file: use "
                               "letters, digits, _ and - only")
                if not isinstance(path, str) or not path:
                    out.append(f"predict.inputs.{name} must be a file path; got {path!r}")
        if isinstance(self.text_column, list) and not 1 <= len(self.text_column) <= 2:
            out.append(f"predict.text_column lists {len(self.text_column)} columns; give 1, or 2 "
                       "for a sentence pair")
        if self.workers < 0:
            out.append(f"predict.workers must be >= 0 (0 = no Ray); got {self.workers}")
        if self.chunk_rows < 1:
            out.append(f"predict.chunk_rows must be >= 1; got {self.chunk_rows}")
        return out


SECTIONS: dict[str, type] = {
    "prepare": PrepareConfig,
    "tokenize": TokenizeConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "data": DataConfig,
    "ray": RayConfig,
    "mlflow": MlflowConfig,
    "predict": PredictConfig,
}


def _type_problem(key: str, value: Any, hint: Any) -> str | None:
    """Return a message when `value` does not fit the annotation `hint`, else None."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed and str(value).lower() not in allowed:
            return f"{key} must be one of {', '.join(map(str, allowed))}; got {value!r}"
        return None
    if hint is bool:
        return None if isinstance(value, bool) else f"{key} must be true or false; got {value!r}"
    if hint is int and number(value, integer=True) is None:
        return f"{key} must be an integer; got {value!r}"
    if hint is float and number(value) is None:
        return f"{key} must be a number; got {value!r}"
    if hint is str and not isinstance(value, str):
        return f"{key} must be a string; got {value!r}"
    return None


# A decimal number as people and tools write it: `3e-05` (how DVC's `-S train.lr=3e-5` lands in
# params.yaml), `1E-4`, `.5`, `2.`, `+1e3`. PyYAML implements YAML 1.1, whose floats need a dot and
# a signed exponent, so it loads `3e-05` and `1E-4` as strings; here they are numbers again.
NUMBER = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*")


def number(value: Any, integer: bool = False) -> int | float | None:
    """`value` as a number, or None when it is not one (a bool, a word, nan or inf).

    With `integer`, integral values count (`1e3`, `2.0` -> 1000, 2) and others do not (`2.5`)."""
    if isinstance(value, str) and NUMBER.fullmatch(value):
        value = float(value) if re.search("[.eE]", value) else int(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or (integer and not value.is_integer()):
            return None
        return int(value) if integer else value
    return value if integer else float(value)


def _coerce(value: Any, hint: Any) -> Any:
    if hint in (int, float):
        return number(value, integer=hint is int)
    if typing.get_origin(hint) is Literal and not isinstance(value, str):
        return str(value).lower()  # YAML reads `use_gpu: true` as a bool
    return value


def load_section(params: dict, name: str):
    """Build section `name` from the params dict; raise one ValueError listing every problem."""
    cls = SECTIONS[name]
    raw = params.get(name) or {}
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise ValueError(f"params: section '{name}' must be a mapping; got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, value in raw.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f" (did you mean '{name}.{close[0]}'?)" if close else ""
            problems.append(f"unknown key '{name}.{key}'{hint}")
            continue
        problem = _type_problem(f"{name}.{key}", value, hints[key])
        if problem:
            problems.append(problem)
        else:
            values[key] = _coerce(value, hints[key])
    section = cls(**values)  # the well-typed values; range checks run on them too
    problems += section.problems() if hasattr(section, "problems") else []
    if not problems:
        return section
    raise ValueError("invalid params: " + "; ".join(problems))


def load_params(path: str | Path, *names: str) -> tuple:
    """Read params.yaml and load the named sections, collecting problems across all of them."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: params file not found; run from the project root")
    try:
        params = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML ({err}); fix the syntax") from None
    unknown = sorted(set(params) - set(SECTIONS))
    problems = []
    for key in unknown:
        close = difflib.get_close_matches(key, list(SECTIONS), n=1)
        problems.append(f"unknown section '{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    sections = []
    for name in names:
        try:
            sections.append(load_section(params, name))
        except ValueError as err:
            problems.append(str(err).removeprefix("invalid params: "))
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return tuple(sections)


def flatten(sections: dict[str, Any]) -> dict[str, Any]:
    """{'train': TrainConfig(...)} -> {'train.lr': 1e-4, ...} for MLflow params."""
    flat = {}
    for name, section in sections.items():
        for f in dataclasses.fields(section):
            flat[f"{name}.{f.name}"] = getattr(section, f.name)
    return flat


__all__ = [
    "PrepareConfig", "TokenizeConfig", "ModelConfig", "TrainConfig", "DataConfig", "RayConfig", "MlflowConfig",
    "PredictConfig",
    "load_section", "load_params", "flatten", "SECTIONS",
]
