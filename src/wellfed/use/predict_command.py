"""`wellfed-predict`'s command line: the arguments are read and checked before anything heavy
is imported, so `--help` and a mistyped argument answer at once. The predictions themselves
(pandas, the model, torch, Ray) are wellfed.use.predict's, imported once the arguments are
good: importing them first made `wellfed-predict --help` take 26 s on a loaded 2-core machine
(torch alone ~8.5 s of imports here)."""

from __future__ import annotations

import argparse
import sys

CHUNK_ROWS = 8192
"""Rows per model pass by default: predict.chunk_rows's default (PredictConfig), written out here
so that `--help` imports no config (~0.5 s of imports on a loaded 2-core machine);
tests/test_predict.py checks that the two agree."""

USAGE = """Predictions on new, unlabelled files with a registered model or an exported model directory.

MODEL is a registry URI, models:/wellfed-classifier@champion (or models:/<name>/<version>),
looked up in the MLflow store ($MLFLOW_TRACKING_URI, else ./mlflow.db), or a model directory
such as data/model. INPUT is any file `prepare` reads (CSV, TSV, JSONL, Parquet). OUTPUT
(.parquet or .csv) holds one row per input row, in input order (docs/model.md)."""


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(prog="wellfed-predict", description=USAGE,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parse.add_argument("model", help="a registered model, models:/wellfed-classifier@champion "
                       "(in $MLFLOW_TRACKING_URI, else ./mlflow.db), or a model directory "
                       "(data/model: the last run in this workspace)")
    parse.add_argument("input", help="an unlabelled CSV, TSV, JSONL or Parquet file")
    parse.add_argument("output", help="where the predictions go (.parquet or .csv)")
    parse.add_argument("--text-column", action="append", dest="text_columns",
                       help="the text column (a name or 0-based position); twice for a pair "
                            "(default: the columns the model was trained on)")
    parse.add_argument("--no-header", action="store_true", help="CSV/TSV line 1 is data")
    parse.add_argument("--format", default="auto", choices=["auto", "csv", "tsv", "jsonl",
                                                            "parquet"])
    parse.add_argument("--quoting", default="auto", choices=["auto", "none", "csv"])
    parse.add_argument("--workers", type=int, default=0,
                       help="Ray Data workers (one GPU or CPU each) on a local Ray or the "
                            "cluster $RAY_ADDRESS names; 0 = this process only (default)")
    parse.add_argument("--chunk-rows", type=int, default=CHUNK_ROWS,
                       help=f"rows per model pass (default {CHUNK_ROWS})")
    return parse


def main(argv: list[str] | None = None) -> None:
    parse = parser()
    args = parse.parse_args(sys.argv[1:] if argv is None else argv)
    if args.workers < 0 or args.chunk_rows < 1:
        parse.error("--workers must be >= 0 and --chunk-rows >= 1")
    if not args.output.endswith((".parquet", ".csv")):
        parse.error(f"OUTPUT {args.output!r} must end in .parquet or .csv")

    from wellfed.cli import guarded

    def run() -> None:
        from wellfed.use.predict import predict_file

        rows = predict_file(args.model, args.input, args.output,
                            text_columns=args.text_columns, fmt=args.format,
                            header=not args.no_header, quoting=args.quoting,
                            chunk_rows=args.chunk_rows, workers=args.workers)
        on = f" on {args.workers} Ray worker(s)" if args.workers else ""
        print(f"[wellfed] predict: {rows} rows of {args.input} -> {args.output}{on}")

    guarded(run, "predict")


if __name__ == "__main__":
    main()
