"""The compiled-per-shape forward of train/step/fusion.py on this CPU, with a counting backend in
place of inductor (inductor compiled a 2-layer model for 148 s here; the real kernels and their
capture are tests/gpu/test_cuda_fusion.py): the planned step runs through it, compiles once per
shape and not again, learns what the plain planned step learns, and keys its cache folder by the
model, the shapes and the versions."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from tests.train.test_graphs import CPU, planned_setup, task_file
from wellfed.telemetry.meter import StepMeter
from wellfed.telemetry.peak import Peak
from wellfed.train.step import fusion
from wellfed.train.step.feeding import feed
from wellfed.train.step.step import train_step


def test_the_cache_key_follows_model_shapes_precision_mode_and_versions(monkeypatch):
    base = ({"hidden_size": 32}, [(16, 8), (8, 30)], "bf16", fusion.MODE, "NVIDIA H100")
    key = fusion.cache_key(*base)
    assert len(key) == 16 and key == fusion.cache_key(*base)
    assert fusion.cache_key(base[0], base[1][::-1], *base[2:]) == key  # order of the plan
    changed = [({"hidden_size": 64}, *base[1:]), (base[0], [(16, 8)], *base[2:]),
               (*base[:2], "fp32", *base[3:]), (*base[:3], "default", base[4]),
               (*base[:4], "NVIDIA H200")]
    assert len({fusion.cache_key(*c) for c in changed} | {key}) == 6
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert fusion.cache_key(*base) != key


def planned_steps(s, data, path, n):
    meter = StepMeter(CPU, Peak(1e12, "test"), s.model.config)
    fed = feed(s, data, path, 0, epochs=20)
    return [float(train_step(s, step, batches, meter, data.lengths).loss)
            for step, batches in itertools.islice(fed, n)]


@pytest.mark.slow  # dynamo traces the tiny BERT once per shape: ~23 s on 2 busy cores
def test_the_planned_step_runs_the_per_shape_compile(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))
    monkeypatch.setattr(torch.compiler.config, "recompile_limit",
                        torch.compiler.config.recompile_limit)
    data = task_file(tmp_path / "t.arrow", "single_label", rows=300)
    graphs_made = []

    def counting(gm, example_inputs):  # a backend: dynamo's graph, run as it is
        graphs_made.append(gm)
        return gm.forward

    torch.compiler.reset()  # no frame cached from another test
    compiled = planned_setup(tiny_model_dir, data, "single_label", cuda_graphs="true")
    folder = fusion.compile_shapes(compiled, tmp_path / "cache", backend=counting)
    assert compiled.compiled is not None and folder.is_dir()
    assert folder.parent == tmp_path / "cache"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder)
    assert torch.compiler.config.recompile_limit >= len(compiled.spec.shapes()) + 1
    losses = planned_steps(compiled, data, tmp_path / "t.arrow", 8)
    after_8 = len(graphs_made)
    assert after_8 >= 2  # several shapes, each its own graph
    planned_steps(compiled, data, tmp_path / "t.arrow", 8)  # the same 8 steps' shapes again
    assert len(graphs_made) == after_8  # nothing compiled twice
    plain = planned_setup(tiny_model_dir, data, "single_label", cuda_graphs="true")
    assert losses == pytest.approx(planned_steps(plain, data, tmp_path / "t.arrow", 8), rel=1e-5)


def test_compile_shapes_needs_the_planned_step(tmp_path, tiny_model_dir):
    data = task_file(tmp_path / "t.arrow", "single_label", rows=60)
    dynamic = planned_setup(tiny_model_dir, data, "single_label", cuda_graphs="false")
    with pytest.raises(ValueError, match="needs the planned step"):
        fusion.compile_shapes(dynamic, tmp_path / "cache")
