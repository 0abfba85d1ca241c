"""The predictor over an exported model directory, and the same model through MLflow: logged,
registered, loaded with mlflow.pyfunc and served with `mlflow models serve`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import own_wellfed
from tests.services import free_port
from wellfed.track import tracking
from wellfed.use import logged_model, serving

LABELS = ["negative", "card/lost", "refund?"]  # keys: negative, card_lost, refund
# Very different lengths, in no length order: batches are length-sorted and scattered back.
TEXTS = ["ok", "the film was a slow, long and in the end rather pointless affair " * 6,
         "bad .", "a fine cast and a script that never finds its feet, but a lovely score",
         "meh", "an honest , warm and funny film ."]


def save_model(tiny_model_dir: Path, dest: Path, labels: list[str], problem_type: str,
               extra: dict | None = None) -> Path:
    """A random-init tiny BERT with `labels` saved like the train stage exports one."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(tiny_model_dir, num_labels=len(labels),
                                        id2label=dict(enumerate(labels)),
                                        label2id={n: i for i, n in enumerate(labels)},
                                        problem_type=problem_type)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(tiny_model_dir / name, dest / name)
    if extra is not None:
        (dest / serving.SPEC_FILE).write_text(json.dumps(extra))
    return dest


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    return save_model(tiny_model_dir, tmp_path_factory.mktemp("model"), LABELS,
                      "single_label_classification")


@pytest.fixture(scope="module")
def predictor(model_dir):
    return serving.load(model_dir)


def one_by_one(predictor, frame: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([serving.predict(predictor, frame.iloc[[i]]) for i in range(len(frame))])


def test_single_label_outputs_in_input_order(predictor):
    frame = pd.DataFrame({"sentence": TEXTS})
    out = serving.predict(predictor, frame, batch_rows=2)  # 3 length-sorted batches
    assert list(out.columns) == ["label", "score", "prob_negative", "prob_card_lost",
                                 "prob_refund", "truncated"]
    assert not out["truncated"].any()  # the longest, ~80 tokens, is within max_length 128
    assert len(out) == len(TEXTS) and out.index.equals(frame.index)
    alone = one_by_one(predictor, frame)  # no batch, no padding: the reference
    probs = out.filter(like="prob_").to_numpy()
    np.testing.assert_allclose(probs, alone.filter(like="prob_").to_numpy(), atol=1e-5)
    np.testing.assert_allclose(probs.sum(1), 1, atol=1e-5)
    assert out["label"].tolist() == [LABELS[i] for i in probs.argmax(1)]
    np.testing.assert_allclose(out["score"], probs.max(1), atol=1e-7)


def test_any_single_string_column_is_the_text_and_a_missing_column_is_one_line(predictor):
    out = serving.predict(predictor, pd.DataFrame({"review": ["good", "bad ."]}))
    assert len(out) == 2
    with pytest.raises(ValueError, match=r"no column 'sentence' .* rename the column"):
        serving.predict(predictor, pd.DataFrame({"review": ["a"], "id": [1]}))
    assert serving.predict(predictor, pd.DataFrame({"sentence": []})).shape == (0, 6)


@pytest.mark.parametrize("blank", [None, float("nan"), "", "  \t "])
def test_an_empty_text_is_refused_naming_its_row_as_prepare_and_predict_do(predictor, blank):
    """One rule (wellfed.texts): null or only whitespace is no text, in training, predict and
    here; a request's row is counted from 0, as its list and predict's `row` column count it
    (the pandas index MLflow's error prints beside it)."""
    frame = pd.DataFrame({"sentence": ["fine", blank, "ok", blank]})
    with pytest.raises(ValueError) as err:
        serving.predict(predictor, frame)
    assert str(err.value) == ("input: row 1 (0-based) has empty text in column 'sentence' (2 such "
                              "rows); every row needs a text: fill it in or remove the row")


def test_a_text_longer_than_max_length_is_cut_and_flagged(tiny_model_dir, tmp_path):
    short = serving.load(save_model(tiny_model_dir, tmp_path / "short", LABELS,
                                    "single_label_classification", {"max_length": 16}))
    texts = ["ok", "word " * 14, "word " * 15, "long " * 20_000, "x" * 100_000]  # 16 tokens fit
    out = serving.predict(short, pd.DataFrame({"sentence": texts}))
    assert out["truncated"].tolist() == [False, False, True, True, False]  # "x"*: one [UNK]
    pairs = serving.load(save_model(tiny_model_dir, tmp_path / "pairs", LABELS,
                                    "single_label_classification",
                                    {"text_columns": ["a", "b"], "max_length": 16}))
    out = serving.predict(pairs, pd.DataFrame({"a": ["ok", "word " * 10], "b": ["ok", "more " * 10]}))
    assert out["truncated"].tolist() == [False, True]  # a pair counts both texts


@pytest.mark.integration
def test_importing_the_predictor_leaves_mlflow_unimported():
    """A stage sets MLflow's log level after its imports (cli.console); MLflow reads it once,
    when first imported, so an import of serving must not import MLflow."""
    code = "import sys, wellfed.use.serving; print('mlflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_multi_label_pairs_and_regression(tiny_model_dir, tmp_path):
    multi = serving.load(save_model(
        tiny_model_dir, tmp_path / "multi", ["a", "b", "c"], "multi_label_classification",
        {"task": "multi_label", "text_columns": ["premise", "hypothesis"], "threshold": 0.5,
         "max_length": 16}))
    frame = pd.DataFrame({"hypothesis": TEXTS[::-1], "premise": TEXTS})
    out = serving.predict(multi, frame)
    assert list(out.columns) == ["labels", "prob_a", "prob_b", "prob_c", "truncated"]
    probs = out.filter(like="prob_").to_numpy()
    assert [list(x) for x in out["labels"]] == \
        [[n for n, p in zip("abc", row) if p >= 0.5] for row in probs]
    np.testing.assert_allclose(probs, one_by_one(multi, frame).filter(like="prob_").to_numpy(),
                               atol=1e-5)
    with pytest.raises(ValueError, match="no column 'hypothesis'"):
        serving.predict(multi, frame[["premise"]])

    reg = serving.load(save_model(tiny_model_dir, tmp_path / "reg", ["price", "stars"],
                                  "regression", {"task": "regression"}))
    out = serving.predict(reg, pd.DataFrame({"text": TEXTS}))
    assert list(out.columns) == ["price", "stars", "truncated"]
    assert out[["price", "stars"]].dtypes.eq("float64").all() and out["truncated"].dtype == bool
    with pytest.raises(ValueError, match="does not fit config.json's problem_type"):
        serving.read_spec(save_model(tiny_model_dir, tmp_path / "bad", ["x"], "regression",
                                     {"task": "single_label"}))


@pytest.fixture(scope="module")
def registered(model_dir, tmp_path_factory):
    """The model logged into a run of a real sqlite store and registered, as the train stage does."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    run_id = tracking.start_run(uri, "serve", "r")
    info, version = logged_model.log_model(uri, run_id, model_dir, "serve-classifier")
    assert str(version.version) == "1"
    return uri, run_id, info


def test_registered_model_loads_with_pyfunc_and_answers_in_input_order(registered, predictor):
    import mlflow

    uri, run_id, info = registered
    client = mlflow.MlflowClient(uri)
    version = client.get_model_version("serve-classifier", "1")
    assert version.run_id == run_id and version.source == f"models:/{info.model_id}"
    logged = client.get_logged_model(info.model_id)
    assert logged.source_run_id == run_id and logged.tags["wellfed.task"] == "single_label"
    assert logged.name == "serve-classifier"  # what the runs table's Models column shows
    assert info.signature.inputs.input_names() == ["sentence"]

    mlflow.set_tracking_uri(uri)
    frame = pd.DataFrame({"sentence": TEXTS})
    with own_wellfed():
        model = mlflow.pyfunc.load_model("models:/serve-classifier/1")
        out = model.predict(frame)
    expected = serving.predict(predictor, frame)
    assert out["label"].tolist() == expected["label"].tolist()
    np.testing.assert_allclose(out["score"], expected["score"], atol=1e-6)
    # the model carries its own code: wellfed's serving module and what it imports
    code = Path(mlflow.artifacts.download_artifacts(f"models:/serve-classifier/1")) / "code"
    assert sorted(str(p.relative_to(code / "wellfed")) for p in (code / "wellfed").rglob("*.py")) \
        == ["__init__.py", "device.py", "names.py", "tasks.py", "texts.py", "use/__init__.py",
            "use/serving.py"]
    # an empty text: MLflow's invalid-input error, whose message is wellfed's line
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as err:
        model.predict(pd.DataFrame({"sentence": ["fine", ""]}))
    assert err.value.error_code == "INVALID_PARAMETER_VALUE"
    assert err.value.message == ("input: row 1 (0-based) has empty text in column 'sentence' "
                                 "(1 such row); every row needs a text: fill it in or remove the "
                                 "row")


EMPTY = ("input: row {} (0-based) has empty text in column 'sentence' (1 such row); every row "
         "needs a text: fill it in or remove the row")
NULLS = [  # every request format MLflow's scoring server takes, a null text in each
    ({"inputs": {"sentence": ["ok", None]}}, 1), ({"inputs": {"sentence": None}}, 0),
    ({"inputs": {"sentence": [None]}}, 0), ({"inputs": ["ok", None]}, 1),
    ({"instances": [{"sentence": "ok"}, {"sentence": None}]}, 1),
    ({"instances": [{"sentence": None}]}, 0), ({"instances": ["ok", None]}, 1),
    ({"dataframe_split": {"columns": ["sentence"], "data": [["ok"], [None]]}}, 1),
    ({"dataframe_records": [{"sentence": "ok"}, {"sentence": None}]}, 1),
    ({"dataframe_records": [{"sentence": "ok"}, {}]}, 1)]
NOT_TEXT = [({"inputs": {"sentence": ["ok", 3]}}, "3 (int)"),
            ({"instances": ["ok", True]}, "True (bool)"),
            ({"dataframe_split": {"columns": ["sentence"], "data": [["ok"], [1.5]]}},
             "1.5 (float)"),
            ({"dataframe_records": [{"sentence": "ok"}, {"sentence": ["a"]}]}, "['a'] (list)")]


def answer(model, body: dict):
    """What MLflow's scoring server answers `body` (in-process: its own `invocations`)."""
    from mlflow.pyfunc import scoring_server

    return scoring_server.invocations(json.dumps(body), "application/json", model,
                                      model.metadata.get_input_schema())


def test_every_request_format_refuses_a_null_text_and_reads_texts_alike(registered, predictor):
    """One rule: a null text is refused (a 400 naming its row and column) in every format,
    never read as the text "None"; a value that is not a string is refused too; and the texts
    of every format get the same predictions."""
    import mlflow
    from mlflow.exceptions import MlflowException

    uri, _, _ = registered
    mlflow.set_tracking_uri(uri)
    assert len(NULLS) == 10 and len(NOT_TEXT) == 4
    with own_wellfed():
        model = mlflow.pyfunc.load_model("models:/serve-classifier/1")
        for body, row in NULLS:
            with pytest.raises(MlflowException) as err:
                answer(model, body)
            assert err.value.get_http_status_code() == 400, body
            assert err.value.message.endswith(f"Error: {EMPTY.format(row)}"), (body, err.value)
        for body, shown in NOT_TEXT:
            with pytest.raises(MlflowException) as err:
                answer(model, body)
            assert err.value.get_http_status_code() == 400, body
            assert err.value.message.endswith(
                f"Error: input: row 1 (0-based) in column 'sentence' is {shown}, not a text; send "
                "each text as a string"), (body, err.value)
        texts = TEXTS[:3]
        expected = serving.predict(predictor, pd.DataFrame({"sentence": texts}))
        for body in ({"inputs": {"sentence": texts}}, {"inputs": texts},
                     {"instances": [{"sentence": t} for t in texts]}, {"instances": texts},
                     {"dataframe_split": {"columns": ["sentence"], "data": [[t] for t in texts]}},
                     {"dataframe_records": [{"sentence": t} for t in texts]}):
            rows = json.loads(answer(model, body).response)["predictions"]
            assert [r["label"] for r in rows] == expected["label"].tolist(), body
            np.testing.assert_allclose([r["score"] for r in rows], expected["score"], atol=1e-5)
        one = json.loads(answer(model, {"inputs": {"sentence": texts[1]}}).response)
        assert [r["label"] for r in one["predictions"]] == expected["label"].tolist()[1:2]


def test_a_row_of_lists_is_unpacked_for_pairs_and_refused_when_lengths_differ():
    """MLflow hands {"inputs": {"premise": [...], "hypothesis": [...]}} (every value a list of
    strings) over as one row of lists: its rows; lists of different lengths are no rows."""
    spec = serving.ModelSpec("single_label", ("premise", "hypothesis"), 0.5, 128, ("a", "b"))
    one = pd.DataFrame({"premise": [["p1", "p2"]], "hypothesis": [["h1", "h2"]]})
    rows = serving.served_rows(one, spec)
    assert rows.to_dict("list") == {"premise": ["p1", "p2"], "hypothesis": ["h1", "h2"]}
    ragged = pd.DataFrame({"premise": [["p1", "p2"]], "hypothesis": [["h1"]]})
    assert serving.served_rows(ragged, spec) is ragged
    with pytest.raises(ValueError, match=r"^input: row 0 \(0-based\) in column 'premise' is \['p1', "
                                         r"'p2'\] \(list\), not a text"):
        serving.text_columns(ragged, spec)
    plain = pd.DataFrame({"premise": ["p"], "hypothesis": ["h"]})
    assert serving.served_rows(plain, spec) is plain


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def refused(url: str, body: dict) -> tuple[int, str]:
    """(HTTP status, response body) of a request the server refuses."""
    try:
        post(url, body)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    raise AssertionError(f"{body} was answered")


@pytest.mark.e2e  # a real server process; ~15 s on 2 busy cores
def test_mlflow_models_serve_answers_invocations(registered, predictor, tmp_path):
    uri, _, _ = registered
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)  # the served model imports wellfed from its own code/ folder
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(["mlflow", "models", "serve", "-m", "models:/serve-classifier/1",
                             "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                            start_new_session=True)  # its own process group, ended below
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise AssertionError((tmp_path / "serve.log").read_text()[-3000:])
                time.sleep(0.5)
        expected = serving.predict(predictor, pd.DataFrame({"sentence": TEXTS}))
        split = post(f"{url}/invocations", {"dataframe_split": {"columns": ["sentence"],
                                                                "data": [[t] for t in TEXTS]}})
        inputs = post(f"{url}/invocations", {"inputs": {"sentence": TEXTS}})
        for answer in (split, inputs):
            rows = answer["predictions"]
            assert [r["label"] for r in rows] == expected["label"].tolist()
            np.testing.assert_allclose([r["score"] for r in rows], expected["score"], atol=1e-5)
            assert [r["truncated"] for r in rows] == [False] * len(TEXTS)
        # A bad row: MLflow's 400 with wellfed's line (MLflow puts "Failed to predict data
        # '<the input>'. Error: " before it), no stack trace, nothing of the server's files.
        for body in ({"dataframe_split": {"columns": ["sentence"], "data": [["ok"], [None]]}},
                     {"inputs": {"sentence": ["ok", "  "]}}, {"inputs": {"sentence": ["ok", None]}},
                     {"instances": [{"sentence": "ok"}, {"sentence": None}]}):
            status, text = refused(f"{url}/invocations", body)
            answer = json.loads(text)
            assert status == 400 and answer["error_code"] == "INVALID_PARAMETER_VALUE", text
            assert answer["message"].endswith(
                "Error: input: row 1 (0-based) has empty text in column 'sentence' (1 such row); "
                "every row needs a text: fill it in or remove the row"), text
            assert "stack_trace" not in answer and "Traceback" not in text
            assert "site-packages" not in text and str(tmp_path) not in text, text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
