"""`dvc plots show` / `dvc plots diff` draw offline, each curve once: scripts/plots_page.py (which
`make install` runs) puts the Vega libraries inline in DVC's page template, from the
vl-convert-python package, and sets it in .dvc/config.local; DVC's own page loads them from a
CDN and is blank without the internet. dvc.yaml names each curve once (its history files were
also `plots:` outputs, drawn again whole)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROJECT

DVC = str(Path(sys.executable).with_name("dvc"))


def run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.mark.integration
def test_dvc_plots_draw_offline_and_each_curve_once(tmp_path):
    shutil.copy(PROJECT / "dvc.yaml", tmp_path / "dvc.yaml")
    shutil.copy(PROJECT / "params.yaml", tmp_path / "params.yaml")
    for name in ("data/train/history/steps.csv", "data/train/history/validation.csv",
                 "data/eval/confusion.csv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PROJECT / name, tmp_path / name)
    run(["git", "init", "-q"], tmp_path)
    run([DVC, "init", "-q"], tmp_path)
    run([DVC, "config", "core.analytics", "false"], tmp_path)
    shown = json.loads(run([DVC, "plots", "show", "--json"], tmp_path))
    assert sorted(shown["data"]) == ["data/eval/confusion.csv", "loss", "val_accuracy",
                                     "val_macro_f1"] and not shown.get("errors")
    default = (tmp_path / "dvc_plots" / "index.html")
    run([DVC, "plots", "show"], tmp_path)
    assert "https://cdn.jsdelivr.net/npm/vega@" in default.read_text()  # DVC's own: online only
    said = run([sys.executable, str(PROJECT / "scripts" / "plots_page.py"), str(tmp_path)],
               tmp_path)
    assert said.startswith("[wellfed] dvc plots show/diff draw offline: .dvc/tmp/plots.html")
    assert "html_template = tmp/plots.html" in (tmp_path / ".dvc" / "config.local").read_text()
    run([DVC, "plots", "show"], tmp_path)
    page = default.read_text()
    assert "<script src=" not in page  # no library fetched: all inline
    assert "window.vegaEmbed=" in page and "vegaEmbed('#loss'" in page
    assert page.count("vegaEmbed('#") == 4  # the three curves and the confusion matrix, once
