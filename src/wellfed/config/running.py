"""`ray`, `mlflow` and `predict`: where training runs, where it is recorded, and predicting on
new files."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Literal


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
    gpus_per_worker: float = 1.0
    """GPUs each worker asks Ray for: 1 = a GPU of its own; a share below 1 lets trials placed
    on a Ray cluster share one (0.25 = four small-model trials on a GPU: a MiniLM trial used
    0.6 GB of an H100's 80 and 13% of its time); a whole number for a worker that needs more."""
    max_failures: int = 2
    """Restarts from the last checkpoint before giving up (-1 = no limit): on Ray Train, of a
    worker group that failed and, counted apart, of one Ray could not place again (a lost node:
    each such start waits up to RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S, 60 s, for room); a
    trial Ray placed is sent again this many times when its node dies. Then: on_lost_node."""
    on_lost_node: Literal["shrink", "stop"] = "shrink"
    """When the restarts are spent and the cluster has less room than the run's workers (a node
    was lost): shrink = go on from the last checkpoint on the workers that fit, the same global
    batch, into the same MLflow run; stop = one line saying what to run, the MLflow run FAILED,
    its checkpoint kept. With no room for even one worker it stops either way."""
    storage_path: str = ""
    """Checkpoints (and, for multi-node runs, the token files) go here: "" = the train stage's
    checkpoint folder; set it to shared storage (NFS path, s3://...) for a multi-node cluster."""
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    """How Ray places workers: PACK fills a node first, SPREAD puts them on different nodes."""
    in_process: Literal["auto", "false"] = "auto"
    """auto = one worker and no cluster address trains in the stage's own process, without
    Ray Train's start and stop (train/run/local.py); false = always on Ray Train (worker restarts
    on failure: max_failures)."""

    def problems(self) -> list[str]:
        out = []
        if self.num_workers < 1:
            out.append(f"ray.num_workers must be >= 1; got {self.num_workers}")
        if self.cpus_per_worker < 1:
            out.append(f"ray.cpus_per_worker must be >= 1; got {self.cpus_per_worker}")
        if not (0 < self.gpus_per_worker < 1 or (self.gpus_per_worker >= 1
                                                 and float(self.gpus_per_worker).is_integer())):
            out.append(f"ray.gpus_per_worker must be a share below 1 (0.25 = four trials on a "
                       f"GPU) or a whole number >= 1; got {self.gpus_per_worker}")
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
    sweep: str = ""
    """The sweep this run is a trial of ("" = none): its MLflow run is tagged wellfed.sweep and
    nested under one parent run `sweep <id>` (the UI shows a sweep as one expandable row), and
    `wellfed-compare sweep:<a> sweep:<b>` compares two sweeps over their seeds. Set it on each
    queued variant: `dvc exp run --queue -S mlflow.sweep=lr-grid -S train.lr=...`."""

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
        if self.sweep and not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", self.sweep):
            out.append(f"mlflow.sweep must be letters, digits, '.', '_' or '-' (it is searched "
                       f"for in MLflow); got {self.sweep!r}: e.g. lr-grid")
        return out


@dataclass(frozen=True)
class PredictConfig:
    """`predict`: the optional predict stages (`dvc repro predict`): the exported model's
    per-row predictions for unlabelled files."""

    inputs: dict[str, str] = dataclasses.field(default_factory=dict)
    """name -> an unlabelled file (any format prepare reads); each gets a stage `predict@name`
    writing data/predictions/<name>.parquet. {} = no predict stage at all (the default)."""
    allow_outside: bool = False
    """Read `inputs` files where they resolve even outside the project (an absolute path, a
    `..`, or a link to a file elsewhere); false refuses such a file before a byte of it is
    read, naming the entry and the fix. DVC tracks each file either way (it is its stage's
    dependency)."""
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


