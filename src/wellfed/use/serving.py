"""Predictions from an exported model directory (`data/model`): a plain function, and the same
function as an MLflow pyfunc model (`classifier_model`) that the train stage logs and registers
(wellfed/use/logged_model.py).

The model directory's contract: `config.json` is the Hugging Face config, whose `problem_type`
says how logits become outputs; an optional `wellfed.json` beside it holds
`{"task", "text_columns", "threshold", "max_length"}` (absent: single-label, one text column,
0.5, 128) and a `calibration` record: a fitted temperature is already in the weights
(wellfed/evaluate/temperature.py), so nothing here applies it. Outputs, one row per input row, in input
order:

| task         | head    | columns                                                         |
|--------------|---------|-----------------------------------------------------------------|
| single_label | softmax | `label` (id2label text), `score` (its probability), `prob_<key>` |
| multi_label  | sigmoid | `labels` (texts with probability >= threshold), `prob_<key>`     |
| regression   | none    | one column per target, named by id2label, raw values            |

then `truncated`: whether the row was longer than the model's max_length tokens and cut to it.
`<key>` is the label's safe key (wellfed.names.keys): label text may hold any character. A row
with an empty text is refused (wellfed.texts: the rule prepare and predict apply too); as an
MLflow model, with MLflow's invalid-input error (HTTP 400) whose message is that one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from wellfed import device as dev
from wellfed import texts as rule
from wellfed.names import keys
from wellfed.tasks import MODEL_INFO, PROBLEM_TYPE, outputs

SPEC_FILE = MODEL_INFO
TASKS = {problem: task for task, problem in PROBLEM_TYPE.items()}  # config.json's name -> ours


@dataclass(frozen=True)
class ModelSpec:
    """What a model directory says about its inputs and outputs."""

    task: str
    """single_label | multi_label | regression."""
    text_columns: tuple[str, ...]
    """The input column(s): one text, or two for a sentence pair (first, second)."""
    threshold: float
    """multi_label: a label is predicted when its probability is at least this."""
    max_length: int
    """Tokens per row (a pair counts both texts); longer rows are truncated, longest text first."""
    labels: tuple[str, ...]
    """id2label texts in id order (regression: the target names)."""


@dataclass(frozen=True)
class Predictor:
    """A loaded model, ready for `predict`."""

    model: torch.nn.Module
    tokenizer: object
    spec: ModelSpec
    device: torch.device
    precision: dev.Precision


def read_spec(model_dir: str | Path) -> ModelSpec:
    """The ModelSpec of a model directory, from config.json and the optional wellfed.json."""
    model_dir = Path(model_dir)
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} not found; point at an exported model directory "
                                "(the train stage writes data/model)")
    config = json.loads(config_file.read_text(encoding="utf-8"))
    extra_file = model_dir / SPEC_FILE
    extra = json.loads(extra_file.read_text(encoding="utf-8")) if extra_file.is_file() else {}
    from_config = TASKS.get(config.get("problem_type") or "single_label_classification")
    task = extra.get("task", from_config)
    if task not in TASKS.values() or (from_config and "problem_type" in config
                                      and config["problem_type"] and task != from_config):
        raise ValueError(f"{extra_file}: task {task!r} does not fit config.json's problem_type "
                         f"{config.get('problem_type')!r}; one of {sorted(TASKS.values())}, "
                         "matching the head the model was trained with")
    id2label = config.get("id2label") or {str(i): f"LABEL_{i}"
                                          for i in range(config.get("num_labels", 2))}
    labels = tuple(str(id2label[str(i)]) for i in range(len(id2label)))
    columns = tuple(extra.get("text_columns", ["sentence"]))
    if len(columns) not in (1, 2):
        raise ValueError(f"{extra_file}: text_columns must name one column or two (a sentence "
                         f"pair); got {list(columns)}")
    return ModelSpec(task=task, text_columns=columns, threshold=float(extra.get("threshold", 0.5)),
                     max_length=int(extra.get("max_length", 128)), labels=labels)


def load(model_dir: str | Path, device: torch.device | None = None) -> Predictor:
    """Model, tokenizer and spec from an exported model directory, on the GPU when there is one."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    spec = read_spec(model_dir)
    device = device or torch.device("cuda" if dev.cuda_available() else "cpu")
    hf_logging.disable_progress_bar()  # a local directory: no download to show, only noise
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), use_fast=True)
    # Regression outputs are the raw numbers: bf16's 8-bit mantissa would round 123.4 to 123.
    precision = (dev.Precision("fp32", "regression: raw outputs keep full precision")
                 if spec.task == "regression" else dev.choose_precision("auto", device))
    return Predictor(model.eval().to(device), tokenizer, spec, device, precision)


def text_columns(frame: pd.DataFrame, spec: ModelSpec) -> list[pd.Series]:
    """The input's text column(s) as strings; one string column is taken whatever its name when
    the model reads one text. A row with an empty text is refused (wellfed.texts)."""
    names = list(spec.text_columns)
    if len(names) == 1 and names[0] not in frame.columns:
        strings = [c for c in frame.columns if pd.api.types.is_string_dtype(frame[c])]
        if len(strings) == 1 and len(frame.columns) == 1:
            names = strings
    for name in names:
        if name not in frame.columns:
            raise rule.InputError(f"input has no column {name!r} (columns: "
                                  f"{list(frame.columns)}); the model reads "
                                  f"{list(spec.text_columns)}: rename the column")
    for name in names:
        not_text(frame[name], name)
    rule.check({name: frame[name] for name in names}, "input",
               "every row needs a text: fill it in or remove the row", first=0)
    return [frame[name].astype(str) for name in names]


def not_text(values: pd.Series, name: str) -> None:
    """Refuse the first value that is neither a string nor null (the empty-text rule's): read
    as str(), 3, true or ['a'] would be the texts "3", "True", "['a']", as null was "None"."""
    odd = ~(values.map(lambda v: isinstance(v, str)).to_numpy(bool) | values.isna().to_numpy(bool))
    if odd.any():
        at = int(np.flatnonzero(odd)[0])
        value = values.iloc[at]
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise rule.InputError(f"input: {rule.row_name(at, first=0)} in column {name!r} is "
                              f"{shown} ({type(value).__name__}), not a text; send each text as "
                              "a string")


def served_rows(frame: pd.DataFrame, spec: ModelSpec) -> pd.DataFrame:
    """A request's rows. With the text columns typed Any (`input_schema`), MLflow hands
    `{"inputs": {"sentence": ["a", "b"]}}` (every value a list of strings) over as ONE row
    holding the lists: such a row is unpacked."""
    names = [n for n in spec.text_columns if n in frame.columns]
    if len(frame) != 1 or not names:
        return frame
    cells = [frame[n].iat[0] for n in names]
    if not all(isinstance(c, (list, tuple, np.ndarray)) for c in cells) or len(
            {len(c) for c in cells}) != 1:
        return frame
    return pd.DataFrame({n: list(c) for n, c in zip(names, cells)})


def truncated_rows(tok, encoded, texts: list[list[str]], max_length: int) -> np.ndarray:
    """Which rows the tokenizer cut to `max_length` tokens: a fast tokenizer says so per row
    (`overflowing`); a slow one's rows at the limit are encoded again, uncut, to tell."""
    if encoded.encodings is not None:
        return np.fromiter((bool(e.overflowing) for e in encoded.encodings), bool,
                           len(encoded.encodings))
    lengths = np.fromiter(map(len, encoded["input_ids"]), np.int64)
    out = np.zeros(len(lengths), bool)
    for i in np.flatnonzero(lengths >= max_length):
        whole = tok(*[[column[i]] for column in texts], truncation=False)["input_ids"][0]
        out[i] = len(whole) > max_length
    return out


def batches(lengths: np.ndarray, batch_rows: int, batch_tokens: int) -> list[np.ndarray]:
    """Row indices grouped longest first, each group at most `batch_rows` rows and (rows x its
    longest row) `batch_tokens` padded tokens: rows of like length share a batch, so little
    padding is computed (SST-2-like texts: ~0.95 real tokens per computed one vs ~0.3 unsorted)."""
    order = np.argsort(-lengths, kind="stable")
    groups, start = [], 0
    while start < len(order):
        width = max(int(lengths[order[start]]), 1)  # longest first: the first row sets the width
        rows = max(1, min(batch_rows, batch_tokens // width))
        groups.append(order[start:start + rows])
        start += rows
    return groups


def padded(rows: list[list[int]], width: int, value: int) -> np.ndarray:
    out = np.full((len(rows), width), value, np.int64)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def predict(predictor: Predictor, frame: pd.DataFrame, batch_rows: int = 64,
            batch_tokens: int = 8192) -> pd.DataFrame:
    """One output row per input row, in input order (with the input's index): see the module
    docstring for the columns."""
    spec, tok = predictor.spec, predictor.tokenizer
    texts = [c.tolist() for c in text_columns(frame, spec)]
    if not len(frame):  # the tokenizer refuses an empty batch
        return output_frame(np.zeros((0, len(spec.labels)), np.float32), spec, frame.index,
                            np.zeros(0, bool))
    enc = tok(*texts, truncation="longest_first" if len(texts) == 2 else True,
              max_length=spec.max_length, return_attention_mask=False)
    cut = truncated_rows(tok, enc, texts, spec.max_length)
    ids = enc["input_ids"]
    types = enc.get("token_type_ids")
    lengths = np.fromiter((len(r) for r in ids), np.int64, len(ids))
    out = np.zeros((len(ids), len(spec.labels)), np.float32)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    with torch.no_grad():
        for idx in batches(lengths, batch_rows, batch_tokens):
            width = int(lengths[idx].max())
            host = {"input_ids": padded([ids[i] for i in idx], width, pad_id),
                    "attention_mask": (np.arange(width) < lengths[idx, None]).astype(np.int64)}
            if types is not None:
                host["token_type_ids"] = padded([types[i] for i in idx], width, 0)
            batch = dev.to_device(host, predictor.device)
            with dev.autocast(predictor.device, predictor.precision):
                logits = predictor.model(**batch).logits
            # scattered back to the rows' input positions
            out[idx] = outputs(spec.task, logits).cpu().numpy()
    return output_frame(out, spec, frame.index, cut)


def output_frame(values: np.ndarray, spec: ModelSpec, index: pd.Index,
                 truncated: np.ndarray) -> pd.DataFrame:
    if spec.task == "regression":
        out = pd.DataFrame(values.astype(np.float64), columns=list(spec.labels), index=index)
        out[rule.TRUNCATED] = truncated
        return out
    labels = np.asarray(spec.labels, object)
    head: dict[str, object] = {}
    if spec.task == "single_label":
        best = values.argmax(1) if len(values) else np.zeros(0, np.int64)
        head = {"label": labels[best],
                "score": values[np.arange(len(values)), best].astype(np.float64)}
    else:
        head = {"labels": [labels[row >= spec.threshold].tolist() for row in values]}
    probs = {f"prob_{k}": values[:, i].astype(np.float64) for i, k in enumerate(keys(spec.labels))}
    return pd.DataFrame({**head, **probs, rule.TRUNCATED: truncated}, index=index)


def classifier_model():
    """`predict` as an MLflow pyfunc model over its artifact `model` (the model directory).

    The class is made here, not at import: importing MLflow fixes its log level, and a stage
    sets that level (cli.console) after its imports. Nothing is pickled (ENTRY_POINT), so a
    class made in a function is fine."""
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    class ClassifierModel(mlflow.pyfunc.PythonModel):
        def load_context(self, context):
            self.predictor = load(context.artifacts["model"])

        # The hint: MLflow checks inputs by the logged signature, not by this hint; without
        # one it warns when the class is made.
        def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
            try:
                rows = served_rows(pd.DataFrame(model_input), self.predictor.spec)
                return predict(self.predictor, rows)
            except rule.InputError as err:  # the input's fault, in one line: a 400
                # MLflow's scoring server sends an MlflowException's message and code as they
                # are; any other error becomes a generic 400 whose stack_trace carries this
                # server's file paths to the client. `from None`: no chained traceback either.
                raise MlflowException.invalid_parameter_value(str(err)) from None

    return ClassifierModel()
