"""predict (off by default): the exported model's per-row predictions for one unlabelled file.

usage: python stages/predict.py MODEL_DIR PREDICTIONS_DIR     (as DVC's stage predict@<name>)

dvc.yaml makes one stage `predict@<name>` per entry of `predict.inputs` (none by default). DVC
runs a stage's command through a shell, so no params value is in it: the stage takes <name>
from $DVC_STAGE (which DVC sets to the stage's name), reads that entry's file, checked to be
inside the project unless predict.allow_outside, and writes PREDICTIONS_DIR/<name>.parquet.
"""

import os
from pathlib import Path

from wellfed.cli import stage
from wellfed.config import load_params
from wellfed.data import boundary


@stage
def main(model_dir, predictions_dir):
    cfg, ray_cfg = load_params("params.yaml", "predict", "ray")  # names checked: a safe charset
    # After the checks: a name they refuse costs no model code's imports (3.8 s here).
    from wellfed.use.predict import predict_file, stage_entry

    name = stage_entry(os.environ.get("DVC_STAGE", ""), cfg.inputs)
    key = f"predict.inputs.{name}"
    paths, _ = boundary.confined(".", {key: cfg.inputs[name]}, allow_key="predict.allow_outside",
                                 allowed=cfg.allow_outside, folder_words="the project",
                                 put_in="the project", stage=None)
    predictions = Path(predictions_dir) / f"{name}.parquet"
    rows = predict_file(model_dir, paths[key], predictions, text_columns=cfg.text_columns(),
                        fmt=cfg.format, header=cfg.header, quoting=cfg.quoting,
                        chunk_rows=cfg.chunk_rows, workers=cfg.workers, address=ray_cfg.address)
    on = f" on {cfg.workers} Ray worker(s)" if cfg.workers else ""
    print(f"[wellfed] predict: {rows} rows of {paths[key]} -> {predictions}{on}")


if __name__ == "__main__":
    main()
