"""The compiled-per-shape forward (train/step/fusion.py) on a real GPU: inductor's kernels for each
planned shape, captured in the shape's CUDA graph, learn what the plain graphed step learns
(bf16 rounding apart: fused kernels round in other places), and inductor's cache lands in
the keyed folder. Inductor's default mode here: max-autotune only changes which matrix
multiply kernels are picked, at many times the compile time (benchmarks/gpu_scale.py measures
that mode).

Skipped without a CUDA device: `python -m pytest tests/gpu -m cuda` on a GPU box.
"""

from __future__ import annotations

import pytest
import torch

from tests.gpu.test_cuda_graphs import assert_same_learning, run

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_compiled_shapes_are_captured_and_learn_as_the_plain_graphs(tiny_model_dir, token_file,
                                                                    tmp_path, monkeypatch):
    from wellfed.train.step import fusion
    from wellfed.train.step import setup as setup_module

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))
    made = setup_module.setup
    folders = []

    def compiling_setup(*args, **kwargs):
        s = made(*args, **kwargs)
        folders.append(fusion.compile_shapes(s, tmp_path / "cache", mode="default"))
        return s

    plain = run(tiny_model_dir, token_file, dropout=False)
    monkeypatch.setattr("tests.gpu.test_cuda_graphs.setup", compiling_setup)
    torch.compiler.reset()
    try:
        compiled = run(tiny_model_dir, token_file, dropout=False)
    finally:
        torch.compiler.reset()  # the next tests run their models uncompiled
    g = compiled[0].graphs
    assert compiled[0].compiled is not None and not g.failed, g.failed
    assert len(g.micro) >= 2 and g.replays > g.eager and g.update is not None
    assert any(folders[0].iterdir())  # inductor wrote its cache under the keyed folder
    assert_same_learning(compiled, plain, 5e-2, 5e-2)
