"""Predictions on new, unlabelled files with an exported model directory.

    python -m wellfed.predict MODEL_DIR INPUT OUTPUT [--text-column NAME ...] [--no-header]
                                                     [--format F] [--quoting Q]

INPUT is any file `prepare` reads (CSV, TSV, JSONL, Parquet; sniffed without an extension), with
the same checks and one-line errors. The text column(s) default to the ones the model was
trained on (its wellfed.json); a pair model takes two. OUTPUT (.parquet or .csv) holds one row
per input row, in input order: `row` (the 0-based data row) and the model's outputs
(wellfed.serving: label, score and prob_<key> per class; labels and prob_<key> for multi-label;
one column per target for regression). Rows go through the model in chunks of `chunk_rows`,
each length-bucketed, and are written as they come: the output never holds more than one chunk
in memory, and it appears whole or not at all. On the GPU when there is one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from wellfed import serving
from wellfed.cli import guarded
from wellfed.data import sources
from wellfed.outputs import atomic_path

CHUNK_ROWS = 8192  # rows per model pass: bounds memory, keeps the length buckets full


def predict_file(model_dir: str | Path, input_path: str | Path, output_path: str | Path, *,
                 text_columns: list | None = None, fmt: str = "auto", header: bool = True,
                 quoting: str = "auto", chunk_rows: int = CHUNK_ROWS) -> int:
    """Write the predictions for every row of `input_path` to `output_path`; return the rows."""
    output_path = Path(output_path)
    if output_path.suffix not in (".parquet", ".csv"):
        raise ValueError(f"{output_path}: the output must end in .parquet or .csv")
    predictor = serving.load(model_dir)
    spec = predictor.spec
    columns = list(text_columns or spec.text_columns)
    if len(columns) != len(spec.text_columns):
        raise ValueError(f"{model_dir} reads {len(spec.text_columns)} text column(s) "
                         f"({', '.join(spec.text_columns)}); give that many with --text-column, "
                         f"not {len(columns)}")
    frame = sources.read_texts(input_path, fmt, columns if len(columns) > 1 else columns[0],
                               header=header, quoting=quoting)
    with atomic_path(output_path) as tmp, tqdm(total=len(frame), desc="predict", unit="rows",
                                               mininterval=1.0, leave=False) as bar:
        writer = None
        for start in range(0, len(frame), chunk_rows):
            part = frame.iloc[start:start + chunk_rows]
            inputs = pd.DataFrame({name: part[source].values for name, source
                                   in zip(spec.text_columns, ("text", "text_pair"))})
            out = serving.predict(predictor, inputs)
            out.insert(0, "row", part["row"].values)
            if output_path.suffix == ".csv":
                out.to_csv(tmp, mode="a", header=start == 0, index=False)
            else:
                table = pa.Table.from_pandas(out, preserve_index=False)
                writer = writer or pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table)
            bar.update(len(part))
        if writer:
            writer.close()
        elif output_path.suffix == ".parquet":  # no rows: still a readable, empty file
            pd.DataFrame({"row": []}).to_parquet(tmp, index=False)
    return len(frame)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m wellfed.predict", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", help="an exported model directory (data/model)")
    parser.add_argument("input", help="an unlabelled CSV, TSV, JSONL or Parquet file")
    parser.add_argument("output", help="where the predictions go (.parquet or .csv)")
    parser.add_argument("--text-column", action="append", dest="text_columns",
                        help="the text column (a name or 0-based position); twice for a pair "
                             "(default: the columns the model was trained on)")
    parser.add_argument("--no-header", action="store_true", help="CSV/TSV line 1 is data")
    parser.add_argument("--format", default="auto", choices=["auto", "csv", "tsv", "jsonl",
                                                             "parquet"])
    parser.add_argument("--quoting", default="auto", choices=["auto", "none", "csv"])
    args = parser.parse_args(argv)

    def run() -> None:
        rows = predict_file(args.model_dir, args.input, args.output,
                            text_columns=args.text_columns, fmt=args.format,
                            header=not args.no_header, quoting=args.quoting)
        print(f"[wellfed] predict: {rows} rows of {args.input} -> {args.output}")

    guarded(run, "predict")


if __name__ == "__main__":
    main(sys.argv[1:])
