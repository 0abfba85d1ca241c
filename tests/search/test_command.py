"""wellfed-search's sizing options: they override params.yaml's search section for one search
without writing params.yaml, and a bad value is one line naming the option and the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from wellfed.config import load_params
from wellfed.search.command import arguments, options, shown_options, sized

PROJECT = Path(__file__).resolve().parents[2]


def test_the_options_override_the_search_section():
    (cfg,) = load_params(PROJECT / "params.yaml", "search")
    args = arguments(["--trials", "4", "--max-steps", "48", "--min-steps", "8",
                      "--concurrent", "2", "--seeds", "5,6"])
    given = options(args)
    assert given == {"trials": "4", "max_steps": "48", "min_steps": "8", "concurrent": "2",
                     "seeds": [5, 6]}
    new = sized(cfg, given)
    assert (new.trials, new.max_steps, new.min_steps, new.concurrent, new.seeds) == \
        (4, 48, 8, 2, [5, 6])
    assert new.space == cfg.space and new.reduction_factor == cfg.reduction_factor
    assert shown_options(given) == "--trials 4 --max-steps 48 --min-steps 8 --concurrent 2 " \
                                   "--seeds 5,6"


def test_no_option_keeps_params_yaml_as_it_is():
    (cfg,) = load_params(PROJECT / "params.yaml", "search")
    assert sized(cfg, options(arguments([]))) is cfg


@pytest.mark.parametrize("argv, said", [
    (["--trials", "0"], "wellfed-search --trials 0: search.trials must be >= 1; got 0"),
    (["--trials", "four"], "wellfed-search --trials four: search.trials must be an integer; "
                           "got 'four'"),
    (["--max-steps", "20", "--min-steps", "16"],
     "search.max_steps 20 leaves ASHA no rung to stop a trial at"),
    (["--concurrent", "-1"], "search.concurrent must be >= 0"),
    (["--seeds", "1,x"], "wellfed-search --seeds '1,x': the seeds must be whole numbers"),
    (["--seeds", "4"], "search.seeds lists 1 seed"),
])
def test_a_bad_option_is_one_line_before_any_work_and_params_yaml_is_unchanged(
        tmp_path, argv, said):
    params = tmp_path / "params.yaml"
    params.write_bytes((PROJECT / "params.yaml").read_bytes())
    proc = subprocess.run([sys.executable, "-m", "wellfed.search.command", "--params",
                           str(params), *argv], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], proc.stderr
    assert params.read_bytes() == (PROJECT / "params.yaml").read_bytes()
    assert not (tmp_path / "data").exists()  # no search folder, no token files


def test_help_lists_the_sizing_options():
    proc = subprocess.run([sys.executable, "-m", "wellfed.search.command", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    found = [o for o in ("--trials", "--max-steps", "--min-steps", "--concurrent", "--seeds")
             if o in proc.stdout]
    assert len(found) == 5, proc.stdout


def test_help_says_both_paths(capsys):
    """The default path fuses trials and halves them in step, where --concurrent counts groups;
    ASHA is the other path, not the only one."""
    with pytest.raises(SystemExit):
        arguments(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "successive halving" in text and "one at a time with Ray Tune's ASHA" in text
    assert "--concurrent N groups of fused trials at once, or with ASHA trials at once" in text
    assert "ASHA stops" not in text and "ASHA's first rung" not in text
