"""check: params.yaml as a whole, before any other stage: every section and key known (a typo
gets its "did you mean"), every value valid, all problems in one line.

DVC runs it whenever params.yaml changes (the whole file is its one param) and first (it is
first in dvc.yaml and nothing depends on it), so `dvc exp run -S trian.lr=3e-5` or
`-S +ray.num_worker=2` fails here, before any stage runs, even when no stage reads the key and
none would have run. An unchanged params.yaml leaves it up to date: `dvc status` stays quiet.

usage: python stages/check.py PARAMS_YAML
"""

from wellfed.cli import stage
from wellfed.config import SECTIONS, load_params


@stage
def main(params_yaml):
    load_params(params_yaml, *SECTIONS)
    print(f"[wellfed] {params_yaml}: every section and key known, every value valid")


if __name__ == "__main__":
    main()
