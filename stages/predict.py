"""predict (off by default): the exported model's per-row predictions for one unlabelled file.

usage: python stages/predict.py MODEL_DIR INPUT PREDICTIONS

dvc.yaml makes one stage `predict@<name>` per entry of `predict.inputs` (none by default), with
INPUT that entry's file and PREDICTIONS data/predictions/<name>.parquet.
"""

from wellfed.cli import stage
from wellfed.config import load_params
from wellfed.use.predict import predict_file


@stage
def main(model_dir, input_path, predictions):
    cfg, ray_cfg = load_params("params.yaml", "predict", "ray")
    rows = predict_file(model_dir, input_path, predictions, text_columns=cfg.text_columns(),
                        fmt=cfg.format, header=cfg.header, quoting=cfg.quoting,
                        chunk_rows=cfg.chunk_rows, workers=cfg.workers, address=ray_cfg.address)
    on = f" on {cfg.workers} Ray worker(s)" if cfg.workers else ""
    print(f"[wellfed] predict: {rows} rows of {input_path} -> {predictions}{on}")


if __name__ == "__main__":
    main()
