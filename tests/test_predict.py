"""`wellfed-predict`: any file prepare reads -> predictions in input row order, chunk
by chunk, with prepare's one-line errors and nothing written on failure."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tests.test_serving import TEXTS, save_model
from wellfed.config import PredictConfig, load_params
from wellfed.data import sources
from wellfed.use import logged_model, serving
from wellfed.use.predict import input_chunks, predict_file, write_predictions


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
    assert list(one.columns) == ["row", "text", "text_pair", "label", "score", "prob_no",
                                 "prob_yes", "truncated"]
    pairs = [ln.rstrip("\n").split("\t") for ln in lines]  # the input beside its prediction
    assert one["text"].tolist() == many["text"].tolist() == [a for a, _ in pairs]
    assert one["text_pair"].tolist() == [b for _, b in pairs]
    np.testing.assert_allclose(one["prob_yes"], many["prob_yes"], rtol=1e-5)
    direct = serving.predict(serving.load(pair_model), pd.DataFrame(
        {"premise": [a for a, _ in (ln.rstrip("\n").split("\t") for ln in lines)],
         "hypothesis": [b for _, b in (ln.rstrip("\n").split("\t") for ln in lines)]}))
    np.testing.assert_allclose(one["prob_yes"], direct["prob_yes"], rtol=1e-5)
    assert one["label"].tolist() == direct["label"].tolist()


@pytest.mark.integration
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
        proc = subprocess.run([sys.executable, "-m", "wellfed.use.predict_command",
                               str(pair_model), args[0], str(out), *args[1:]],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
        assert not out.exists() and not list(tmp_path.glob(".out*"))
    assert len(cases) == 3


@pytest.mark.parametrize("block_bytes", [None, 50])  # 50 B: a block of ~2 rows, chunks span blocks
def test_input_chunks_cover_every_row_once_in_order(tmp_path, monkeypatch, block_bytes):
    if block_bytes:
        monkeypatch.setattr(sources, "BLOCK_BYTES", block_bytes)
    source = tmp_path / "new.jsonl"
    source.write_text("".join(f'{{"sentence": "text {i}"}}\n' for i in range(18)),
                      encoding="utf-8")
    chunks = list(input_chunks(source, ["sentence"], chunk_rows=4))
    assert [len(c) for c in chunks] == [4, 4, 4, 4, 2]
    assert pd.concat(chunks)["row"].tolist() == list(range(18))
    assert pd.concat(chunks)["text"].tolist() == [f"text {i}" for i in range(18)]


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_predictions_out_of_input_order_are_refused_and_nothing_is_written(tmp_path, suffix):
    def chunks():
        yield pd.DataFrame({"row": [2, 3], "label": ["a", "b"]})
        yield pd.DataFrame({"row": [0, 1], "label": ["a", "b"]})

    out = tmp_path / f"out{suffix}"
    with pytest.raises(RuntimeError, match=r"out of input order \(row 0 after 3\)"):
        write_predictions(chunks(), out)
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_an_input_with_no_rows_gives_a_readable_empty_output(tmp_path, pair_model, suffix):
    source = tmp_path / "new.csv"
    source.write_text("premise,hypothesis\n", encoding="utf-8")
    out = tmp_path / f"out{suffix}"
    assert predict_file(pair_model, source, out) == 0
    frame = pd.read_parquet(out) if suffix == ".parquet" else pd.read_csv(out)
    assert len(frame) == 0 and list(frame.columns) == ["row"]


def test_predict_params_collect_every_problem_in_one_error(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("predict:\n  inputs: {my file: new.csv, ok: ''}\n  workers: -1\n"
                      "  chunk_rows: 0\n  text_column: [a, b, c]\n")
    with pytest.raises(ValueError) as err:
        load_params(params, "predict")
    assert str(err.value) == (
        f"{params}: predict.inputs name 'my file' names a stage and a file: use letters, "
        "digits, _ and - only; predict.inputs.ok must be a file path; got ''; predict.text_column lists 3 columns; give 1, or 2 for a sentence pair; "
        "predict.workers must be >= 0 (0 = no Ray); got -1; predict.chunk_rows must be >= 1; "
        "got 0")
    params.write_text("predict:\n  inputs: {new-pairs: data/new.tsv}\n"
                      "  text_column: [premise, hypothesis]\n")
    (cfg,) = load_params(params, "predict")
    assert cfg.inputs == {"new-pairs": "data/new.tsv"} and PredictConfig().inputs == {}
    assert cfg.text_columns() == ["premise", "hypothesis"] and PredictConfig().text_columns() == []


def test_long_rows_are_flagged_and_counted(tmp_path, tiny_model_dir, capsys):
    model = save_model(tiny_model_dir, tmp_path / "m16", ["no", "yes"],
                       "single_label_classification", {"max_length": 16})
    source = tmp_path / "new.jsonl"
    rows = ["fine", "long " * 20_000, "ok", "word " * 15]  # 100,000 characters; 17 tokens
    source.write_text("".join(f'{{"sentence": "{t}"}}\n' for t in rows), encoding="utf-8")
    assert predict_file(model, source, tmp_path / "out.parquet") == 4
    assert pd.read_parquet(tmp_path / "out.parquet")["truncated"].tolist() == [False, True,
                                                                               False, True]
    assert (f"[wellfed] predict: 2 of 4 rows (50.0%) were longer than 16 tokens and were cut "
            f"to it; those rows are flagged in {tmp_path / 'out.parquet'}'s 'truncated' column"
            ) in capsys.readouterr().out


@pytest.mark.integration
def test_a_registry_uri_predicts_with_that_version(tmp_path, monkeypatch, pair_model):
    """models:/<name>@<alias> in the store of the current folder (or $MLFLOW_TRACKING_URI)."""
    import mlflow

    from wellfed.track import tracking

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    source = tmp_path / "new.tsv"
    source.write_text("premise\thypothesis\nA man sleeps.\tA man rests.\nA dog.\tA cat.\n")

    def cli(model: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "wellfed.use.predict_command", model,
                               str(source), str(tmp_path / "out.csv")], capture_output=True,
                              text=True, timeout=300, cwd=tmp_path)

    proc = cli("models:/demo@champion")  # no store here yet: one line, and no store made
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"error: models:/demo@champion: no MLflow store at sqlite:///{tmp_path}/mlflow.db; run "
        "the pipeline here (`dvc repro`) or set MLFLOW_TRACKING_URI to the store that "
        "registered it"), proc.stderr
    assert not (tmp_path / "mlflow.db").exists()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_run(uri, "demo", "r")
    _, version = logged_model.log_model(uri, run_id, pair_model, "demo")
    proc = cli("models:/demo@champion")  # registered, but no alias yet
    assert proc.returncode == 1 and "models:/demo@champion: no such registered version in " \
        f"{uri} (registered models: demo); the evaluate stage sets the alias" in proc.stderr
    mlflow.MlflowClient(uri).set_registered_model_alias("demo", "champion", version.version)
    proc = cli("models:/demo@champion")
    assert proc.returncode == 0, proc.stderr
    assert f"[wellfed] predict with models:/demo@champion (version 1, MLflow run {run_id})" \
        in proc.stdout
    by_uri = pd.read_csv(tmp_path / "out.csv")
    predict_file(pair_model, source, tmp_path / "folder.csv")
    pd.testing.assert_frame_equal(by_uri, pd.read_csv(tmp_path / "folder.csv"))
    # An artifact store elsewhere (a server's, s3://): the files are downloaded for the command.
    from wellfed.use import registered

    monkeypatch.setattr(registered, "logged_files", lambda client, model_id: None)
    with registered.model_folder("models:/demo/1", tmp_path) as (folder, named):
        assert folder.name == pair_model.name and (folder / "config.json").is_file()
        assert named == f"models:/demo/1 (version 1, MLflow run {run_id})"
    assert not folder.exists()  # a temporary copy, gone after the command


HEAVY = ("torch", "transformers", "pandas", "numpy", "pyarrow", "mlflow", "ray", "tqdm")
ASK = """
import sys
from wellfed.use.predict_command import main
try:
    main(sys.argv[1:])
except SystemExit as done:
    print("exit", done.code, [m for m in {heavy!r} if m in sys.modules])
"""


def test_help_and_argument_errors_come_before_any_heavy_import():
    """`wellfed-predict --help` took 26 s on a loaded machine: it imported torch, pandas and
    the model code first. Now the arguments are read, and refused, with the standard library
    alone."""
    cases = [(["--help"], "exit 0 []", "usage: wellfed-predict"),
             (["models:/m@champion", "in.csv"], "exit 2 []", "required: output"),
             (["data/model", "in.csv", "out.txt"], "exit 2 []", "must end in .parquet or .csv"),
             (["data/model", "in.csv", "out.csv", "--workers", "-1"], "exit 2 []",
              "--workers must be >= 0")]
    for args, exit_line, said in cases:
        proc = subprocess.run([sys.executable, "-c", ASK.format(heavy=HEAVY), *args],
                              capture_output=True, text=True, timeout=600)
        assert proc.stdout.strip().splitlines()[-1] == exit_line, (args, proc.stdout, proc.stderr)
        assert said in proc.stdout + proc.stderr, (args, proc.stderr)
    assert len(cases) == 4


def test_the_commands_chunk_default_is_the_params_default():
    """predict_command writes the default out (its arguments are read with the standard library
    alone); predict.py and params.yaml's predict section take it from PredictConfig."""
    from wellfed.use import predict, predict_command

    assert predict_command.parser().get_default("chunk_rows") == PredictConfig.chunk_rows
    assert predict.CHUNK_ROWS == PredictConfig.chunk_rows


@pytest.mark.integration
def test_into_a_pipe_there_is_no_progress_bar_to_glue_lines_onto(tmp_path, pair_model):
    source = tmp_path / "new.tsv"
    source.write_text("premise\thypothesis\nA man sleeps.\tA man rests.\nA dog.\tA cat.\n")
    out = tmp_path / "out.csv"
    proc = subprocess.run([sys.executable, "-m", "wellfed.use.predict_command", str(pair_model),
                           str(source), str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stdout + proc.stderr and "rows/s" not in proc.stderr, proc.stderr
    assert proc.stdout.splitlines()[-1] == f"[wellfed] predict: 2 rows of {source} -> {out}"
