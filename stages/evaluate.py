"""evaluate: score the test split (validation when there is none) and append to the MLflow run.

usage: python stages/evaluate.py TOKENS_DIR MODEL_DIR RUN_JSON EVAL_DIR
"""

import json
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification
from transformers.utils import logging as hf_logging

from wellfed import device as dev
from wellfed import evaluation, tracking
from wellfed.cli import stage
from wellfed.data.shards import TokenFile
from wellfed.outputs import atomic_path, write_json


@stage
def main(tokens_dir, model_dir, run_json, eval_dir):
    tokens, out = Path(tokens_dir), Path(eval_dir)
    meta = json.loads((tokens / "meta.json").read_text())
    split = "test" if (tokens / "test.arrow").is_file() else "validation"
    data = TokenFile(tokens / f"{split}.arrow")
    device = torch.device("cuda" if dev.cuda_available() else "cpu")
    precision = dev.choose_precision("auto", device)
    hf_logging.disable_progress_bar()  # a local directory: no download to show, only noise
    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    names = meta["labels"]
    probs = evaluation.predict(model, data, meta["pad_id"], device, precision)
    metrics = {"split": split, **evaluation.score(data.labels, probs, names)}
    matrix = evaluation.confusion(data.labels, probs, names)
    metrics["confusion_matrix"] = matrix.tolist()
    frame = evaluation.predictions_frame(data, probs, names)
    with atomic_path(out / "predictions.parquet") as tmp:
        frame.to_parquet(tmp, index=False)
    with atomic_path(out / "confusion.csv") as tmp:
        frame[["gold", "predicted"]].to_csv(tmp, index=False)
    with atomic_path(out / "confusion.png") as tmp:
        evaluation.plot_confusion(matrix, names, tmp)
    write_json(out / "report.json", metrics)  # per-class scores, confusion matrix: the detail
    run = json.loads(Path(run_json).read_text())
    tracked = evaluation.tracked(metrics)
    write_json(out / "metrics.json", {k: tracked[k] for k in ("eval/accuracy", "eval/macro_f1")})
    tracking.log_metrics(run["tracking_uri"], run["mlflow_run_id"], tracked)
    tracking.log_artifacts(run["tracking_uri"], run["mlflow_run_id"], out, "eval")
    mapping = {key: scores["label"] for key, scores in metrics["per_class"].items()}
    tracking.log_text(run["tracking_uri"], run["mlflow_run_id"],
                      json.dumps(mapping, indent=2, ensure_ascii=False), "eval/label_keys.json")
    print(f"[wellfed] evaluate on {split} ({metrics['rows']} rows): accuracy "
          f"{metrics['accuracy']:.4f}, macro-F1 {metrics['macro_f1']:.4f}")


if __name__ == "__main__":
    main()
