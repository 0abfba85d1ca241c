"""Predictions on new, unlabelled files with a registered model or an exported model directory.

    wellfed-predict MODEL INPUT OUTPUT [--text-column NAME ...] [--no-header]
                                                 [--format F] [--quoting Q] [--workers N]

MODEL is a registry URI, models:/wellfed-classifier@champion (or models:/<name>/<version>),
looked up in the MLflow store ($MLFLOW_TRACKING_URI, else ./mlflow.db: wellfed.use.registered),
or a model directory such as data/model (after a `dvc exp run`, the last experiment's model).
INPUT is any file `prepare` reads (CSV, TSV, JSONL, Parquet; sniffed without an extension), with
the same checks and one-line errors. The text column(s) default to the ones the model was
trained on (its wellfed.json); a pair model takes two. OUTPUT (.parquet or .csv) holds one row
per input row, in input order: `row` (the 0-based data row), the input's `text` (and
`text_pair` for a pair model) and the model's outputs
(wellfed.use.serving: label, score and prob_<key> per class; labels and prob_<key> for multi-label;
one column per target for regression), then `truncated` (the row was longer than the model's
max_length tokens and was cut to it; the console counts them). Rows go through the model in chunks of `chunk_rows`,
each length-bucketed, and are written as they come: the output never holds more than one chunk
in memory, and it appears whole or not at all. On the GPU when there is one.

--workers N spreads the chunks over N Ray Data workers (one GPU each when the cluster has
GPUs, else one CPU), each loading the model once: on a local Ray started for the command, or
on the cluster $RAY_ADDRESS names (without --workers, RAY_ADDRESS is not used). Every worker
reads MODEL_DIR by its path: on a multi-node cluster it must be on storage every node mounts at
the same path. The output is the same, row for row, as without --workers.

The input is read block by block with prepare's reader (`input_chunks`): in-process, memory
holds a block, a chunk and its predictions, not the file. With --workers the chunks are
gathered in the driver before Ray Data takes them (`from_blocks` takes a list).
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from wellfed.config import PredictConfig
from wellfed.data import sources
from wellfed.outputs import atomic_path
from wellfed.texts import TRUNCATED, truncation_line
from wellfed.use import serving
from wellfed.use.registered import model_folder

CHUNK_ROWS = PredictConfig.chunk_rows
"""Rows per model pass by default (predict.chunk_rows): bounds memory, keeps the length buckets
full."""



def input_chunks(input_path: str | Path, text_columns: list, *, fmt: str = "auto",
                 header: bool = True, quoting: str = "auto",
                 chunk_rows: int = CHUNK_ROWS) -> Iterator[pd.DataFrame]:
    """The input's rows as frames of at most `chunk_rows` rows (`row`, `text`[, `text_pair`]),
    in row order, checked as prepare checks them. The file is read block by block
    (sources.iter_texts, 8 MB blocks), so memory holds a block and a chunk, not the file; a bad
    row in a later block stops the run there (the output is written whole or not at all)."""
    rest = None  # rows of earlier blocks not yet handed on (fewer than chunk_rows)
    for block in sources.iter_texts(input_path, fmt, text_columns if len(text_columns) > 1
                                    else text_columns[0], header=header, quoting=quoting):
        frame = block if rest is None else pd.concat([rest, block], ignore_index=True)
        cut = len(frame) - len(frame) % chunk_rows  # one concat per block, then slices
        for start in range(0, cut, chunk_rows):
            yield frame.iloc[start:start + chunk_rows]
        rest = frame.iloc[cut:] if cut < len(frame) else None
    if rest is not None:
        yield rest


def predict_chunk(predictor: serving.Predictor, part: pd.DataFrame) -> pd.DataFrame:
    """The predictions for one chunk of `input_chunks`: its `row`, the input's `text` (and
    `text_pair`), then the model's outputs; a text column is `input_text` where a regression
    target already holds the name."""
    sources = ("text", "text_pair")[:len(predictor.spec.text_columns)]
    inputs = pd.DataFrame({name: part[source].to_numpy() for name, source
                           in zip(predictor.spec.text_columns, sources)})
    out = serving.predict(predictor, inputs)
    out.insert(0, "row", part["row"].to_numpy())
    for at, source in enumerate(sources, 1):
        out.insert(at, f"input_{source}" if source in out.columns else source,
                   part[source].to_numpy())
    return out


class ChunkPredictor:
    """A Ray Data worker: loads the model once, then predicts every batch of rows it is given."""

    def __init__(self, model_dir: str):
        if not Path(model_dir, "config.json").is_file():
            import socket

            raise FileNotFoundError(f"{model_dir} is not a model directory on node "
                                    f"{socket.gethostname()}; on a multi-node cluster put it on "
                                    "storage every node mounts at the same path")
        self.predictor = serving.load(model_dir)

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        return predict_chunk(self.predictor, batch)


def ray_predictions(model_dir: str | Path, chunks: Iterable[pd.DataFrame], workers: int, *,
                    chunk_rows: int = CHUNK_ROWS, address: str = "") -> Iterator[pd.DataFrame]:
    """The predictions for `chunks` from `workers` Ray Data workers, yielded in input order.

    Each chunk becomes one block in Ray's object store (which spills to disk beyond its memory);
    Ray Data's `preserve_order` hands the predictions back block by block in input order,
    however the workers finish, and the driver holds one block of them at a time."""
    from wellfed import cluster
    from wellfed.config import RayConfig

    ray_cfg = RayConfig(address=address)
    cluster.local_token_auth(ray_cfg)  # before Ray is imported
    import ray
    import ray.data

    cluster.connect(ray_cfg)
    try:
        use_gpu = worker_devices(workers)
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True
        context.enable_progress_bars = False  # the writer's bar counts the rows written
        # Ray Data's own INFO lines ("execution finished in 15.7 s") and its warning that the
        # bars above are off stay in Ray's log files.
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
        context.print_on_execution_start = False
        context.raise_original_map_exception = True  # a worker's error as itself, in one line
        # from_blocks, not from_pandas_refs: that one computes each block's metadata in a Ray
        # task, and here the idle worker it leaves aborted on exit (a 15-line SIGABRT dump on
        # the console) in 4 of 6 runs; from_blocks computes it in the driver (0 of 6).
        # It takes a list: the chunks are views of the input, which is in memory anyway.
        blocks = list(chunks)
        if not blocks:
            return
        predictions = ray.data.from_blocks(blocks).map_batches(
            ChunkPredictor, fn_constructor_args=(str(Path(model_dir).resolve()),),
            batch_size=chunk_rows, batch_format="pandas",
            compute=ray.data.ActorPoolStrategy(size=workers), udf_modifying_row_count=False,
            **({"num_gpus": 1} if use_gpu else {"num_cpus": 1}))
        del blocks
        for table in predictions.iter_batches(batch_size=None, batch_format="pyarrow"):
            yield table.to_pandas()  # numpy-backed columns, as the in-process path writes
    finally:
        ray.shutdown()


def worker_devices(workers: int) -> bool:
    """Whether each worker gets a GPU (when the cluster has any); refuse, before Ray Data would
    wait forever, more workers than the cluster has devices for."""
    from wellfed import cluster

    nodes = cluster.live_nodes()
    device = "GPU" if any(n.get("GPU", 0) for n in nodes) else "CPU"
    room = cluster.room(nodes, {device: 1})
    if workers > room:
        raise ValueError(f"{workers} predict workers with 1 {device} each do not fit this cluster "
                         f"({cluster.described(nodes)}: room for {room}); lower --workers "
                         "(predict.workers) or add nodes")
    return device == "GPU"


def write_predictions(predictions: Iterable[pd.DataFrame], output_path: Path,
                      counts: dict | None = None) -> int:
    """Write the prediction chunks as they come (one in memory at a time) to `output_path`,
    whole or not at all; return the rows written. `counts`, when given, gets the rows flagged
    `truncated` under that key."""
    rows, last, cut = 0, -1, 0
    # disable=None: on a terminal only; into a pipe or a log its redraws would glue the next
    # line onto the bar (as prepare's and tokenize's bars)
    with atomic_path(output_path) as tmp, tqdm(desc="predict", unit="rows", mininterval=1.0,
                                               leave=False, disable=None) as bar:
        writer = None
        for out in predictions:
            if not len(out):
                continue
            order = out["row"].to_numpy()
            if order[0] <= last or (np.diff(order) <= 0).any():  # rows are written as they come
                raise RuntimeError(f"predictions came out of input order (row {order[0]} after "
                                   f"{last})")
            if output_path.suffix == ".csv":
                out.to_csv(tmp, mode="a", header=rows == 0, index=False)
            else:
                table = pa.Table.from_pandas(out, preserve_index=False)
                writer = writer or pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table)
            rows, last = rows + len(out), int(order[-1])
            cut += int(out[TRUNCATED].sum()) if TRUNCATED in out else 0
            bar.update(len(out))
        if writer:
            writer.close()
        elif output_path.suffix == ".parquet":  # no rows: still a readable, empty file
            pd.DataFrame({"row": []}).to_parquet(tmp, index=False)
        elif not rows:
            tmp.write_text("row\n", encoding="utf-8")
    if counts is not None:
        counts[TRUNCATED] = cut
    return rows


def predict_file(model: str | Path, input_path: str | Path, output_path: str | Path, *,
                 text_columns: list | None = None, fmt: str = "auto", header: bool = True,
                 quoting: str = "auto", chunk_rows: int = CHUNK_ROWS, workers: int = 0,
                 address: str = "") -> int:
    """Write the predictions for every row of `input_path` to `output_path`; return the rows.
    `model`: a model directory or a registry URI (wellfed.use.registered). `workers` > 0: on
    that many Ray Data workers (the local Ray, or the cluster `address` or $RAY_ADDRESS names),
    else in this process. Rows cut to the model's max_length are counted on the console."""
    output_path = Path(output_path)
    if output_path.suffix not in (".parquet", ".csv"):
        raise ValueError(f"{output_path}: the output must end in .parquet or .csv")
    with model_folder(model) as (model_dir, named):
        spec = serving.read_spec(model_dir)
        columns = list(text_columns or spec.text_columns)
        if len(columns) != len(spec.text_columns):
            raise ValueError(f"{named} reads {len(spec.text_columns)} text column(s) "
                             f"({', '.join(spec.text_columns)}); give that many with "
                             f"--text-column, not {len(columns)}")
        chunks = input_chunks(input_path, columns, fmt=fmt, header=header, quoting=quoting,
                              chunk_rows=chunk_rows)
        first = next(chunks, None)  # the input is read and checked before the model, Ray, the bar
        chunks = itertools.chain([first] if first is not None else [], chunks)
        if named != str(model):
            print(f"[wellfed] predict with {named}", flush=True)
        counts: dict = {}
        if workers:
            rows = write_predictions(ray_predictions(model_dir, chunks, workers,
                                                     chunk_rows=chunk_rows, address=address),
                                     output_path, counts)
        else:
            predictor = serving.load(model_dir)
            rows = write_predictions((predict_chunk(predictor, part) for part in chunks),
                                     output_path, counts)
    if cut := truncation_line(counts.get(TRUNCATED, 0), rows, spec.max_length, "predict",
                              f"those rows are flagged in {output_path}'s {TRUNCATED!r} column "
                              "(the limit is the model's tokenize.max_length)"):
        print(f"[wellfed] {cut}", flush=True)
    return rows


def stage_entry(addressing: str, inputs: dict) -> str:
    """The `predict.inputs` entry that DVC's stage `predict@<name>` predicts, from its address
    in $DVC_STAGE (`predict@<name>`; `<folder>/dvc.yaml:predict@<name>` when dvc.yaml is not at
    the repository's root). The names are checked before (PredictConfig: letters, digits, _ and
    -), so none holds the ':' or '@' this splits on."""
    kind, at, name = addressing.rpartition("dvc.yaml:")[2].partition("@")
    if kind != "predict" or not at:
        shown = repr(addressing) if addressing else "not set"
        raise ValueError("stages/predict.py is DVC's stage predict@<name>, and takes <name> from "
                         f"$DVC_STAGE, which is {shown}; run dvc repro "
                         "predict@<name>, or wellfed-predict MODEL INPUT OUTPUT for any file")
    if name not in inputs:
        raise ValueError(f"predict.inputs has no entry {name!r} (the stage {addressing}); add "
                         f"it, e.g. {name}: data/new.csv, or run a stage it has")
    return name
