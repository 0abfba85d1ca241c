"""wellfed-search: an adaptive search over params.yaml's `search.space`, then the winner proven
over seeds and made an ordinary DVC experiment (docs/search.md).

usage: wellfed-search [--params params.yaml] [--trials N] [--max-steps N] [--min-steps N]
                      [--concurrent N] [--seeds 1,2,3] [--no-exp]

The sizing options override params.yaml's `search` keys of the same name for this search only
(params.yaml is not written, so they do not ride along into a later `dvc exp run`); the parent
MLflow run records them (`search.options`) beside the search's params.

Reads top to bottom: the params and the token files (`dvc repro tokenize` first, so the tokens
are the params'), the search's id and folder (`data/search/<id>`: the same inputs resume the
same search), its MLflow parent run, Ray (local, or the cluster `ray.address` /
$RAY_ADDRESS names), the search phase (TPE + successive halving of fused groups, or ASHA), the
final check (finalists x seeds), the verdict, and the winner's `dvc exp run`. Stopped by Ctrl-C
or SIGTERM, it saves where it is; the same command resumes it into the same parent run, without
training a finished trial again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path


FOLDER = Path("data/search")
TOKENS = Path("data/tokens")
SIZES = {
    "trials": "recipes the searcher proposes",
    "max_steps": "a trial's full budget in optimizer steps (0: the train section's plan)",
    "min_steps": "the first rung: the smallest budget a trial gets",
    "concurrent": "groups of fused trials at once, or with ASHA trials at once (0: as many as "
                  "Ray fits)",
    "seeds": "the final check's seeds, comma-separated, e.g. 1,2,3",
}
"""The `search` keys a command-line option may set for one search (`--max-steps` sets
search.max_steps), and each option's help."""


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="wellfed-search", description=(
        "An adaptive search over params.yaml's search.space: Optuna's TPE proposes, trials "
        "train fused in groups with successive halving across the search (search.fuse auto) "
        "or one at a time with Ray Tune's ASHA; the best recipes retrained over search.seeds; "
        "the winner run as a DVC experiment. Rerun the same command to resume a stopped "
        "search."))
    parser.add_argument("--params", default="params.yaml", help="the params file (default: "
                        "params.yaml in the project root)")
    for key, text in SIZES.items():
        parser.add_argument("--" + key.replace("_", "-"), dest=key, metavar="N" if key != "seeds"
                            else "S,S,...", help=f"{text} (overrides search.{key} for this "
                            "search; params.yaml is not changed)")
    parser.add_argument("--no-exp", action="store_true", help="stop after the final check: "
                        "print the winner's `dvc exp run` command instead of running it")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)  # --help and usage errors before any heavy import
    from wellfed.cli import guarded

    guarded(lambda: run(args), "wellfed-search")


def options(args: argparse.Namespace) -> dict:
    """The `search` keys the command line sets, as params.yaml would hold them (`--seeds 1,2`:
    [1, 2]); raises one line for seeds that are not whole numbers."""
    from wellfed.config import number

    out = {}
    for key in SIZES:
        text = getattr(args, key, None)
        if text is None:
            continue
        if key == "seeds":
            words = text.replace(",", " ").split()
            seeds = [number(w, integer=True) for w in words]
            if not words or None in seeds:
                raise ValueError(f"wellfed-search --seeds {text!r}: the seeds must be whole "
                                 "numbers separated by commas, e.g. --seeds 1,2,3")
            out[key] = [int(s) for s in seeds]
        else:
            out[key] = text
    return out


def shown_options(given: dict) -> str:
    """`--trials 4 --seeds 1,2`: the options as typed (normalised)."""
    return " ".join(f"--{k.replace('_', '-')} "
                    + (",".join(map(str, v)) if isinstance(v, list) else str(v))
                    for k, v in given.items())


def sized(search_cfg, given: dict):
    """The search section with the command line's sizes in place, checked as params.yaml's
    are (every problem in one line, naming the options)."""
    from wellfed.config import load_section

    if not given:
        return search_cfg
    try:
        return load_section({"search": {**dataclasses.asdict(search_cfg), **given}}, "search")
    except ValueError as err:
        raise ValueError(f"wellfed-search {shown_options(given)}: "
                         f"{str(err).removeprefix('invalid params: ')} (the options override "
                         "params.yaml's search section for this search)") from None


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
    given = options(args)
    search_cfg = sized(search_cfg, given)
    if not search_cfg.space:
        raise ValueError(f"{args.params}: search.space is empty: name what to search, e.g. "
                         "search: {space: {train: {lr: log_uniform 1e-5 3e-4}}}")
    with lock.held(FOLDER):  # one search per project: a second is refused, naming this one
        tokens_ready(args.params)
        meta = json.loads((TOKENS / "meta.json").read_text(encoding="utf-8"))
        result = endings.ended(lambda: driver.run(
            search_cfg, train_cfg, model_cfg, data_cfg, ray_cfg, mlflow_cfg, TOKENS, meta,
            FOLDER, Path.cwd(), run_exp=not args.no_exp, options=shown_options(given)), FOLDER)
    if result.get("stopped"):
        sys.exit(result["stopped"])


if __name__ == "__main__":
    main()
