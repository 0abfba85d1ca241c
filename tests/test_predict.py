"""`python -m wellfed.predict`: any file prepare reads -> predictions in input row order, chunk
by chunk, with prepare's one-line errors and nothing written on failure."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from test_serving import TEXTS, save_model
from wellfed import serving
from wellfed.predict import predict_file


@pytest.fixture(scope="module")
def pair_model(tiny_model_dir, tmp_path_factory):
    return save_model(tiny_model_dir, tmp_path_factory.mktemp("pair"), ["no", "yes"],
                      "single_label_classification",
                      {"task": "single_label", "text_columns": ["premise", "hypothesis"]})


def test_a_headerless_tsv_gives_the_same_predictions_in_input_order_whatever_the_chunks(
        tmp_path, pair_model):
    lines = [f"{a}\t{b}\n" for a, b in zip(TEXTS, reversed(TEXTS))] * 3  # 18 rows
    source = tmp_path / "new_pairs"  # no extension: sniffed, as prepare does
    source.write_text("".join(lines), encoding="utf-8")
    whole = predict_file(pair_model, source, tmp_path / "one.parquet", text_columns=[0, 1],
                         header=False)
    chunked = predict_file(pair_model, source, tmp_path / "many.csv", text_columns=[0, 1],
                           header=False, chunk_rows=4)
    assert whole == chunked == 18
    one = pd.read_parquet(tmp_path / "one.parquet")
    many = pd.read_csv(tmp_path / "many.csv")
    assert one["row"].tolist() == many["row"].tolist() == list(range(18))
    assert list(one.columns) == ["row", "label", "score", "prob_no", "prob_yes"]
    np.testing.assert_allclose(one["prob_yes"], many["prob_yes"], rtol=1e-5)
    direct = serving.predict(serving.load(pair_model), pd.DataFrame(
        {"premise": [a for a, _ in (ln.rstrip("\n").split("\t") for ln in lines)],
         "hypothesis": [b for _, b in (ln.rstrip("\n").split("\t") for ln in lines)]}))
    np.testing.assert_allclose(one["prob_yes"], direct["prob_yes"], rtol=1e-5)
    assert one["label"].tolist() == direct["label"].tolist()


def test_bad_input_is_one_line_exit_1_and_no_output(tmp_path, pair_model):
    source = tmp_path / "new.csv"
    source.write_text("premise,other\nA man sleeps.,x\n,y\n", encoding="utf-8")
    cases = [([str(source)], "no column 'hypothesis' (prepare.text_column)"),
             ([str(source), "--text-column", "premise", "--text-column", "other"],
              f"{source}: data row 2 has empty text (1 such row); fill it in or remove the row"),
             ([str(source), "--text-column", "premise"],
              "reads 2 text column(s) (premise, hypothesis); give that many with --text-column, "
              "not 1")]
    for args, expected in cases:
        out = tmp_path / "out.parquet"
        proc = subprocess.run([sys.executable, "-m", "wellfed.predict", str(pair_model), args[0],
                               str(out), *args[1:]], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
        assert not out.exists() and not list(tmp_path.glob(".out*"))
    assert len(cases) == 3
