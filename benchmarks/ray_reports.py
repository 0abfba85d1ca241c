"""Ray Train's report wait: the train stage on 2 Ray Train workers with Ray's default controller
poll (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=2.0) against wellfed's (0.2, set by the driver).

A worker's `ray.train.report` waits until the controller takes the report before it off a queue
of one, and the controller looks once per poll: with Ray's 2 s, a report that comes less than
2 s after the one before it holds all workers until the next poll. Two cases, each the same train
stage on both sides (1 epoch, the first 2,048 SST-2 train rows, validation = SST-2 dev,
ray.num_workers 2 x 1 CPU) in one scratch project; the stage's own breakdown
(telemetry/phases.py) gives the seconds in `reports`:
  minilm  params.yaml defaults (MiniLM, report_every 10): a CPU step takes ~1 s, so reports come
          seconds apart and the poll should not matter (A B, the control).
  fast    a 2-layer, 32-wide random-init BERT (the tests' model), report_every 5: steps of
          ~30 ms, reports several a second, as on a GPU (A B B A).
Equal learning: both sides' validation accuracy is recorded (the same steps and seed).

usage: python benchmarks/ray_reports.py
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

import harness
import train_stage

NAME = "ray_reports"
ROWS = 2048
SIDES = {"ray_default_2s": "2.0", "wellfed_0.2s": None}
ORDERS = {"minilm": ("ray_default_2s", "wellfed_0.2s"),
          "fast": ("ray_default_2s", "wellfed_0.2s", "wellfed_0.2s", "ray_default_2s")}
TINY_BERT = {"architectures": ["BertForSequenceClassification"], "model_type": "bert",
             "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 64, "max_position_embeddings": 512, "vocab_size": 30522,
             "type_vocab_size": 2, "pad_token_id": 0}


def run(project: Path, interval: str | None) -> dict:
    key = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
    saved = os.environ.pop(key, None)
    if interval is not None:
        os.environ[key] = interval
    try:
        return train_stage.run_wellfed(project)
    finally:
        os.environ.pop(key, None)
        if saved is not None:
            os.environ[key] = saved


def tiny_model(folder: Path) -> str:
    """MiniLM's tokenizer with a 2-layer, 32-wide BERT config (random init)."""
    folder.mkdir(parents=True)
    source = Path(harness.model_path())
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        shutil.copy(source / name, folder / name)
    (folder / "config.json").write_text(json.dumps(TINY_BERT))
    return str(folder)


def case(name: str, scratch: Path) -> dict:
    project = train_stage.make_project(scratch / name, ROWS)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["ray"].update({"num_workers": 2, "cpus_per_worker": 1})
    if name == "fast":
        params["model"].update({"name": tiny_model(scratch / "tiny"), "init": "random"})
        params["train"].update({"report_every": 5, "lr": 2e-3})
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for stage, args in (("prepare", ["data/raw", "data/prepared", "data/reports/prepare.json"]),
                        ("tokenize_text", ["data/prepared", "data/tokens",
                                           "data/reports/tokens.json"])):
        train_stage.timed([sys.executable, f"stages/{stage}.py", *args], project)
    runs = {side: [] for side in SIDES}
    for n, side in enumerate(ORDERS[name], 1):
        record = run(project, SIDES[side])
        record["order"] = n
        runs[side].append(record)
        print(f"[bench] {NAME} {name}: run {n} {side}: {record['wall_s']} s, reports "
              f"{record['parts_s'].get('reports', 0.0)} s, val accuracy "
              f"{record['val_accuracy']:.4f}", flush=True)

    def mean(side: str, pick) -> float:
        return round(sum(pick(r) for r in runs[side]) / len(runs[side]), 1)

    wall = {side: mean(side, lambda r: r["wall_s"]) for side in SIDES}
    return {"case": name, "order": list(ORDERS[name]), "runs": runs, "mean_wall_s": wall,
            "mean_reports_s": {side: mean(side, lambda r: r["parts_s"].get("reports", 0.0))
                               for side in SIDES},
            "same_learning": {side: [r["val_accuracy"] for r in runs[side]] for side in SIDES},
            "ratio": harness.ratio(wall["ray_default_2s"] / wall["wellfed_0.2s"], None,
                                   of="train stage seconds with Ray's 2 s poll",
                                   over="with wellfed's 0.2 s poll")}


def main() -> None:
    harness.require_sst2(NAME)
    clock = harness.Clock()
    with tempfile.TemporaryDirectory(prefix="wellfed-ray-reports-") as tmp:
        cases = [case(name, Path(tmp)) for name in ORDERS]
    harness.write_result(NAME, {
        "what": ("train stage on 2 Ray Train workers (2,048 SST-2 rows, 1 epoch): Ray's default "
                 "controller poll vs wellfed's; wall = subprocess seconds"),
        "commit": train_stage.commit(), "rows": ROWS, "cases": cases,
        "ratios": {f"speed_{c['case']}": c["ratio"] for c in cases},
        "machine": harness.machine(), **clock.summary()})


if __name__ == "__main__":
    main()
