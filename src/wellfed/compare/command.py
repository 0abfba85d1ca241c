"""wellfed-compare: is run B better than run A on the rows both evaluated, or within noise? And
over seeds: is recipe B better than recipe A, the seed-to-seed spread included?

usage: python -m wellfed.compare A B [--tracking-uri URI] [--out compare.json]
       python -m wellfed.compare A1 A2 A3 --vs B1 B2 B3      (two groups: seeds of each recipe)
       python -m wellfed.compare sweep:<a> --vs sweep:<b>     (two sweeps, by id)
       python -m wellfed.compare sweep:<id>                   (one sweep's summary)
       (or `wellfed-compare ...`)

Each run: an MLflow run id, a registry URI (models:/<name>@champion: the run behind that version),
a `dvc exp` name (the MLflow run tagged dvc.exp_name, else the experiment's data/eval from DVC's
cache), a git revision, or a folder holding predictions.parquet; in a group also `sweep:<id>`,
every finished MLflow run tagged wellfed.sweep=<id>.

Two runs: the paired comparison (wellfed.compare.significance), logged to B's MLflow run as vs/* metrics
and a compare/vs_<A>.json artifact when B is an MLflow run. Two groups: the two-way bootstrap over
seeds and rows (wellfed.compare.seed_significance), logged as a run of its own in the experiment of B's
first MLflow run, with vs_seeds/* metrics, the table as its description and the JSON as
compare/groups.json: the result belongs to the two groups, not to one of B's runs (on each of
them it would be one figure repeated N times, and a later comparison against another baseline
would overwrite it). One sweep: its summary (wellfed.compare.sweep_summary: trials, each recipe's
mean ± sd, the best trial, the verdict of the best recipe against the runner-up), written onto
the sweep's parent run as its evaluate stages do. --out writes the JSON either way.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from wellfed import cli, privacy
from wellfed.compare import prediction_sources, seed_significance, significance, sweep_summary
from wellfed.names import key as safe_key
from wellfed.track import tracking
from wellfed.track.runs_view import COMPARISON

log = logging.getLogger("wellfed.compare")


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="wellfed-compare", usage="%(prog)s A B [options] | %(prog)s A1 A2 ... --vs B1 B2 "
        "... [options] | %(prog)s sweep:<id> [options]", description="Paired comparison of two "
        "evaluated runs (B - A), or of two groups of seeded runs (mean B - mean A, seed-to-seed "
        "spread included), or one sweep's summary.")
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="A and B, or with --vs A's runs: MLflow run id, "
                        "models:/<name>@<alias>, dvc exp name, git revision, folder, or (a group) "
                        "sweep:<id>")
    parser.add_argument("--vs", nargs="+", metavar="RUN",
                        help="B's runs (then every RUN before it is A's); B - A is reported")
    parser.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, "
                        "else sqlite:///<current folder>/mlflow.db)")
    parser.add_argument("--out", help="also write the comparison as JSON to this file")
    parser.add_argument("--eval-dir", default="data/eval",
                        help="the evaluate stage's output folder in dvc.yaml (default data/eval)")
    parser.add_argument("--resamples", type=int, default=significance.RESAMPLES,
                        help=f"bootstrap resamples (default {significance.RESAMPLES})")
    parser.add_argument("--seed", type=int, default=significance.SEED,
                        help=f"bootstrap seed (default {significance.SEED})")
    parser.add_argument("--mixed-recipes", action="store_true",
                        help="compare groups whose runs differ in more than train.seed (refused "
                        "otherwise: their spread would be counted as seed noise)")
    parser.add_argument("--no-log", action="store_true",
                        help="do not log to MLflow (B's run, the groups' own run, or the sweep's "
                        "parent run)")
    args = parser.parse_args(argv)
    one_sweep = len(args.runs) == 1 and args.runs[0].startswith(prediction_sources.SWEEP)
    if args.vs is None and len(args.runs) != 2 and not one_sweep:
        parser.error(f"give two runs (A B), two groups (A1 A2 ... --vs B1 B2 ...) or one sweep "
                     f"(sweep:<id>); got {len(args.runs)} runs and no --vs")
    if args.resamples < 100:  # the 2.5th percentile of fewer than 100 values is one or two draws
        parser.error(f"--resamples must be at least 100; got {args.resamples}")
    return args


def run(args: argparse.Namespace) -> dict:
    uri = prediction_sources.default_tracking_uri(args.tracking_uri, Path.cwd())
    if args.vs is None and len(args.runs) == 1:
        return summarised(args, uri, args.runs[0].removeprefix(prediction_sources.SWEEP))
    specs_a, specs_b = (args.runs, args.vs) if args.vs else ([args.runs[0]], [args.runs[1]])
    a = prediction_sources.load_group(specs_a, uri, Path.cwd(), args.eval_dir)
    b = prediction_sources.load_group(specs_b, uri, Path.cwd(), args.eval_dir)
    if len(a) == len(b) == 1:  # a group of one run is a single run: the paired test
        return paired(args, uri, a[0], b[0])
    return grouped(args, uri, (specs_a, a), (specs_b, b))


def paired(args: argparse.Namespace, uri: str, a, b) -> dict:
    result = significance.compare(a, b, args.resamples, args.seed)
    print(significance.table(result))
    text = write(result, args.out)
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


def grouped(args: argparse.Namespace, uri: str, a: tuple, b: tuple) -> dict:
    (specs_a, runs_a), (specs_b, runs_b) = a, b
    log.info("A: %d runs (%s), B: %d runs (%s)", len(runs_a), " ".join(specs_a), len(runs_b),
             " ".join(specs_b))
    recipes = {side: sweep_summary.recipes_in(uri, runs)
               for side, runs in (("A", runs_a), ("B", runs_b))}
    mixed = [sweep_summary.mixed_line(side, len(runs), recipes[side]["differ"])
             for side, runs in (("A", runs_a), ("B", runs_b)) if recipes[side]["differ"]]
    if mixed and not args.mixed_recipes:
        raise ValueError(f"{'; '.join(mixed)}: their spread would be counted as seed noise; "
                         "compare each recipe's seeds as a group (A1 A2 --vs B1 B2), or pass "
                         "--mixed-recipes to compare them anyway")
    for side in recipes:
        if recipes[side]["unchecked"]:
            log.warning("%s: %s not an MLflow run, so not checked to be a seed of the same "
                        "recipe as the others", side, ", ".join(recipes[side]["unchecked"]))
    result = seed_significance.compare_groups(runs_a, runs_b, args.resamples, args.seed,
                                              mixed=mixed)
    result["a"]["specs"], result["b"]["specs"] = specs_a, specs_b
    shown = seed_significance.table(result)
    print(shown)
    text = write(result, args.out)
    mlflow_b = [run.run_id for run in runs_b if run.run_id]
    if args.no_log:
        return result
    if not mlflow_b:
        log.info("not logged to MLflow: none of B's runs is an MLflow run")
        return result
    try:  # as for two runs: a store that refuses is a warning
        run_id = record(uri, result, text, shown, mlflow_b[0])
        log.info("logged vs_seeds/* metrics and compare/groups.json to MLflow run %s, in the "
                 "experiment of B's runs", run_id)
    except Exception as err:
        log.warning("not logged to MLflow: %s", cli.one_line(str(err))[:300])
    return result


def record(uri: str, result: dict, text: str, shown: str, a_run_of_b: str) -> str:
    """The group comparison as an MLflow run of its own, beside B's runs: tags naming both
    groups and their runs, the console table as its description, vs_seeds/* metrics and the
    JSON. It carries no wellfed.sweep tag, so `sweep:<id>` never picks it up."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    experiment = client.get_run(a_run_of_b).info.experiment_id
    tags = {COMPARISON: "mixed recipes" if result["mixed"] else "seeds",
            "mlflow.note.content": f"```\n{shown}\n```"}
    for side in ("a", "b"):
        tags[f"wellfed.compare.{side}"] = " ".join(result[side]["specs"])[:1000]
        tags[f"wellfed.compare.{side}_runs"] = ",".join(
            r["mlflow_run_id"] or r["source"] for r in result[side]["runs"])[:5000]
    name = f"compare {tags['wellfed.compare.a'][:100]} vs {tags['wellfed.compare.b'][:100]}"
    run_id = client.create_run(experiment, run_name=name, tags=tags).info.run_id
    try:
        tracking.log_metrics(uri, run_id, seed_significance.tracked(result))
        tracking.log_text(uri, run_id, text, "compare/groups.json")
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id)
    return run_id


def summarised(args: argparse.Namespace, uri: str, sweep: str) -> dict:
    """One sweep's summary, shown, and written onto its parent run (unless --no-log)."""
    summary = sweep_summary.summarise(uri, sweep, args.resamples, args.seed)
    print("\n".join(sweep_summary.lines(summary, markdown=False)))
    write(summary, args.out)
    if not args.no_log:
        try:  # a store that refuses is a warning: the summary is made and shown
            if sweep_summary.record(uri, summary):
                log.info("wrote the summary onto the sweep's parent run %s",
                         summary["parent_run_id"])
            else:
                log.info("the sweep's parent run %s holds a summary of more trials already",
                         summary["parent_run_id"])
        except Exception as err:
            log.warning("not logged to MLflow: %s", cli.one_line(str(err))[:300])
    return summary


def write(result: dict, out: str | None) -> str:
    """The result as JSON text, also written to `out` when given."""
    text = json.dumps(result, indent=2, ensure_ascii=False) + "\n"
    if out:
        from wellfed.outputs import atomic_path

        with atomic_path(out) as tmp:
            tmp.write_text(text, encoding="utf-8")
        log.info("wrote %s", out)
    return text


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
