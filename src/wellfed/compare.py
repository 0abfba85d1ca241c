"""wellfed-compare: is run B better than run A on the rows both evaluated, or within noise?

usage: python -m wellfed.compare A B [--tracking-uri URI] [--out compare.json]
       (or `wellfed-compare A B`)

A and B: MLflow run ids, registry URIs (models:/<name>@champion: the run behind that version),
`dvc exp` names (the MLflow run tagged dvc.exp_name, else the experiment's data/eval from DVC's
cache), git revisions, or folders holding predictions.parquet.
Prints the paired comparison (wellfed.significance), writes it as JSON with --out, and logs it to
B's MLflow run as compare/* metrics and a compare/vs_<A>.json artifact when B is an MLflow run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from wellfed import cli, prediction_sources, privacy, significance, tracking
from wellfed.names import key as safe_key

log = logging.getLogger("wellfed.compare")


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="wellfed-compare", description="Paired comparison of two evaluated runs (B - A).")
    parser.add_argument("a", help="baseline: MLflow run id, models:/<name>@<alias>, dvc exp name, "
                        "git revision or folder")
    parser.add_argument("b", help="candidate, as A; B - A is reported and logged to B")
    parser.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, "
                        "else sqlite:///<current folder>/mlflow.db)")
    parser.add_argument("--out", help="also write the comparison as JSON to this file")
    parser.add_argument("--eval-dir", default="data/eval",
                        help="the evaluate stage's output folder in dvc.yaml (default data/eval)")
    parser.add_argument("--resamples", type=int, default=significance.RESAMPLES,
                        help=f"bootstrap resamples (default {significance.RESAMPLES})")
    parser.add_argument("--seed", type=int, default=significance.SEED,
                        help=f"bootstrap seed (default {significance.SEED})")
    parser.add_argument("--no-log", action="store_true", help="do not log to B's MLflow run")
    args = parser.parse_args(argv)
    if args.resamples < 100:  # the 2.5th percentile of fewer than 100 values is one or two draws
        parser.error(f"--resamples must be at least 100; got {args.resamples}")
    return args


def run(args: argparse.Namespace) -> dict:
    uri = prediction_sources.default_tracking_uri(args.tracking_uri, Path.cwd())
    a = prediction_sources.load(args.a, uri, Path.cwd(), args.eval_dir)
    b = prediction_sources.load(args.b, uri, Path.cwd(), args.eval_dir)
    result = significance.compare(a, b, args.resamples, args.seed)
    print(significance.table(result))
    text = json.dumps(result, indent=2, ensure_ascii=False) + "\n"
    if args.out:
        from wellfed.outputs import atomic_path

        with atomic_path(args.out) as tmp:
            tmp.write_text(text, encoding="utf-8")
        log.info("wrote %s", args.out)
    if args.no_log:
        return result
    if b.run_id is None:
        log.info("not logged to MLflow: B is not an MLflow run (%s)", b.source)
        return result
    try:  # the comparison is made and shown; a store that refuses must not take it away
        tracking.log_metrics(uri, b.run_id, significance.tracked(result))
        artifact = f"compare/vs_{safe_key(a.run_id or a.ref)}.json"
        tracking.log_text(uri, b.run_id, text, artifact)
        log.info("logged vs/* metrics and %s to MLflow run %s", artifact, b.run_id)
    except Exception as err:
        log.warning("not logged to MLflow run %s: %s", b.run_id, cli.one_line(str(err))[:300])
    return result


def main(argv: list[str] | None = None) -> int:
    """Console entry: every failure a person can act on is one `error:` line and exit 1."""
    privacy.apply()
    cli.console()
    # Two ~100 kB artifacts per run: MLflow's download bars would be four lines of noise.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    args = arguments(argv)
    try:
        run(args)
    except Exception as err:
        text = cli.message(err)
        if text is None:
            if os.environ.get("WELLFED_TRACEBACK"):
                raise
            text = cli.bug_report(err, "compare")
        print(f"error: {cli.one_line(text)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
