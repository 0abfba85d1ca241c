"""data/train/run.json (wellfed/train/outputs/run_record.py): evaluate appends to the MLflow run it
names only when data/model is the model that run exported; else, or without one, one line."""

from __future__ import annotations

import pytest

from wellfed.train.outputs import run_record


def test_a_record_is_read_back_for_its_own_model_only(tmp_path):
    model = tmp_path / "model"
    (model / "tokenizer").mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    path = tmp_path / "run.json"
    with pytest.raises(FileNotFoundError, match=r"run.json: not found: .* run: dvc repro -f "
                                                r"evaluate$"):
        run_record.read(path, model)
    run_record.write(path, model, {"mlflow_run_id": "abc", "tracking_uri": "sqlite:///x.db"})
    record = run_record.read(path, model)
    assert record["mlflow_run_id"] == "abc" and len(record["model_digest"]) == 64
    (model / "model.safetensors").write_bytes(b"other weights")  # another run's model here now
    with pytest.raises(ValueError, match="names MLflow run abc, whose model is not"):
        run_record.read(path, model)


def test_the_digest_is_the_files_by_name_and_content_wherever_the_folder_is(tmp_path):
    for root in (tmp_path / "a", tmp_path / "deeper" / "b"):
        (root / "sub").mkdir(parents=True)
        (root / "x.bin").write_bytes(b"1")
        (root / "sub" / "y.txt").write_text("2")
    assert run_record.model_digest(tmp_path / "a") == run_record.model_digest(
        tmp_path / "deeper" / "b")
    (tmp_path / "a" / "sub" / "y.txt").rename(tmp_path / "a" / "sub" / "z.txt")
    assert run_record.model_digest(tmp_path / "a") != run_record.model_digest(
        tmp_path / "deeper" / "b")
