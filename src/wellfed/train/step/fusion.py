"""Fused kernels inside the planned shapes: the model's forward compiled by inductor once per
planned (rows, width), run by the planned step (train/step/graphs.py) and captured in each shape's
CUDA graph like the eager forward, with a compile cache that persists between processes in a
folder keyed by the model, the shapes and the versions, so only a recipe's first run compiles.

Why: at BERT-base batch 256 an H100 ran ~9% of its peak in the graphed step; layer norms,
GELU, dropout, residual adds and softmax run there as separate memory-bound kernels, which
inductor fuses. Compiling is the cost: the default mode with dynamic shapes took 84 s in a fresh
H100 process. Off by default and not a params key: benchmarks/gpu_scale.py measures it against
the plain planned step on a lent GPU, cold and warm cache; it becomes a key if it wins there.
No GPU has run it yet (docs/gpu.md).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
from pathlib import Path

import torch

from wellfed.train.checkpoints.checkpoint import unwrap

MODE = "max-autotune-no-cudagraphs"
"""Inductor picks each matrix multiply's kernel by timing candidates (at compile time, then
cached); no CUDA graphs of its own: the planned step captures its own, around it."""


def versions() -> dict[str, str]:
    """What a compiled kernel depends on besides the model and the shapes."""
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": str(torch.version.cuda)}
    for package in ("transformers", "triton"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = "none"
    return out


def cache_key(model_config: dict, shapes: list[tuple[int, int]], precision: str, mode: str,
              device_name: str) -> str:
    """16 hex digits of a sha256 over everything a compiled kernel depends on: the model's
    config, the planned shapes, the precision, the compile mode, the device and the versions."""
    facts = {"model": model_config, "shapes": sorted(shapes), "precision": precision,
             "mode": mode, "device": device_name, "versions": versions()}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def raise_recompile_limit(at_least: int) -> None:
    """Room for one compiled graph per shape: dynamo recompiles a frame for each new shape and
    falls back to eager after its recompile limit (8 by default; the plan has up to 16)."""
    config = getattr(torch.compiler, "config", None)
    if not hasattr(config, "recompile_limit"):  # a torch from before the public knob
        from torch._dynamo import config
    config.recompile_limit = max(config.recompile_limit, at_least)


def compile_shapes(s, cache_root: Path, mode: str = MODE, backend: str | object = "inductor",
                   device_name: str = "") -> Path:
    """Compile Setup `s`'s model for its shape plan (s.compiled, which the planned step runs;
    validation and checkpoints keep s.model): one static graph per shape, compiled at the
    shape's first micro-batch (its eager warm-up) and captured at its second. Points inductor's
    cache (TORCHINDUCTOR_CACHE_DIR) at cache_root/<cache_key> and returns that folder; set it
    before anything in the process compiles. `backend` other than inductor (tests) takes no
    mode."""
    if s.graphs is None:
        raise ValueError("compile_shapes needs the planned step (train.cuda_graphs true or auto "
                         "on a GPU)")
    bare = unwrap(s.model)
    shapes = s.spec.shapes()
    key = cache_key(bare.config.to_dict(), shapes, s.precision.name, mode, device_name)
    folder = Path(cache_root) / key
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    raise_recompile_limit(len(shapes) + 1)
    extra = {"mode": mode} if backend == "inductor" else {}
    s.compiled = torch.compile(bare, dynamic=False, backend=backend, **extra)
    return folder
