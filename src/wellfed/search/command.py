"""wellfed-search: an adaptive search over params.yaml's `search.space`, then the winner proven
over seeds and made an ordinary DVC experiment (docs/search.md).

usage: wellfed-search [--params params.yaml] [--no-exp]

Reads top to bottom: the params and the token files (`dvc repro tokenize` first, so the tokens
are the params'), the search's id and folder (`data/search/<id>`: the same inputs resume the
same search), its MLflow parent run, Ray (local, or the cluster `ray.address` /
$RAY_ADDRESS names), the search phase (TPE + ASHA), the final check (finalists x seeds), the
verdict, and the winner's `dvc exp run`. Stopped by Ctrl-C or SIGTERM, it saves where it is;
the same command resumes it into the same parent run, without training a finished trial again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from wellfed.outputs import write_json

FOLDER = Path("data/search")
TOKENS = Path("data/tokens")


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="wellfed-search", description=(
        "An adaptive search (Ray Tune: Optuna's TPE proposes, ASHA stops) over params.yaml's "
        "search.space; the best recipes retrained over search.seeds; the winner run as a DVC "
        "experiment. Rerun the same command to resume a stopped search."))
    parser.add_argument("--params", default="params.yaml", help="the params file (default: "
                        "params.yaml in the project root)")
    parser.add_argument("--no-exp", action="store_true", help="stop after the final check: "
                        "print the winner's `dvc exp run` command instead of running it")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)  # --help and usage errors before any heavy import
    from wellfed.cli import guarded

    guarded(lambda: run(args), "wellfed-search")


def tokens_ready(params: str) -> None:
    """The token files of these params: `dvc repro tokenize` (a second or two when up to date)."""
    started = time.time()
    proc = subprocess.run(["dvc", "repro", "tokenize"], capture_output=True, text=True)
    if not proc.returncode:
        print(f"[wellfed] token files ready (`dvc repro tokenize`, {time.time() - started:.1f} s)",
              flush=True)
    else:
        from wellfed.search.lock import dvc_busy

        busy = dvc_busy(proc.stderr + proc.stdout, Path.cwd(), "then rerun `wellfed-search`")
        if busy:
            raise ValueError(f"`dvc repro tokenize` cannot run before the search: {busy}")
        lines = (proc.stderr + proc.stdout).strip().splitlines()
        ours = [line for line in lines if line.startswith("error: ")]  # a stage's own line
        said = (ours or [line for line in lines if line.startswith("ERROR")] or lines[-1:]
                or ["no output"])[0].removeprefix("error: ")
        raise ValueError(f"`dvc repro tokenize` failed before the search: {said}")


def run(args: argparse.Namespace) -> None:
    from wellfed.config import load_params
    from wellfed.search import driver, endings, lock

    search_cfg, train_cfg, model_cfg, data_cfg, ray_cfg, mlflow_cfg = load_params(
        args.params, "search", "train", "model", "data", "ray", "mlflow")
    if not search_cfg.space:
        raise ValueError(f"{args.params}: search.space is empty: name what to search, e.g. "
                         "search: {space: {train: {lr: log_uniform 1e-5 3e-4}}}")
    with lock.held(FOLDER):  # one search per project: a second is refused, naming this one
        tokens_ready(args.params)
        meta = json.loads((TOKENS / "meta.json").read_text(encoding="utf-8"))
        result = endings.ended(lambda: driver.run(
            search_cfg, train_cfg, model_cfg, data_cfg, ray_cfg, mlflow_cfg, TOKENS, meta,
            FOLDER, Path.cwd(), run_exp=not args.no_exp), FOLDER)
    if result.get("stopped"):
        sys.exit(result["stopped"])


if __name__ == "__main__":
    main()
