"""Decoder backbones (GPT-2, Llama) and LoRA: a tokenizer without a pad token pads with EOS, the
head reads each row's last real token however the batch is padded, both train through
`loop.train`, and LoRA trains only adapters + head, resumes to the same losses, runs under DDP
and exports merged weights that plain transformers loads."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from wellfed import device as dev
from wellfed.config import DataConfig, ModelConfig, TrainConfig, load_section
from wellfed.data.token_files import TokenBatch, TokenFile, write_token_file
from wellfed.model import load_model, load_tokenizer
from wellfed.train.checkpoints import checkpoint
from wellfed.train.step.loop import Place, TrainJob, train

CPU = Place(torch.device("cpu"))
WORDS = [f"w{i}" for i in range(62)]
EOS, SIGNAL = 0, 40  # token ids: <eos> is 0, "w38" (id 40) marks label 1
TINY = {
    # dropout off: a resumed run must replay the uninterrupted run's losses exactly
    "gpt2": dict(model_type="gpt2", n_layer=2, n_embd=64, n_head=2, n_positions=128,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "llama": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128),
}


def decoder_tokenizer():
    """A WordLevel tokenizer with an EOS token and, like GPT-2's and Llama's, no pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": EOS, "<unk>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")


@pytest.fixture(scope="module", params=sorted(TINY))
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    from transformers import AutoConfig

    out = {}
    for name, kwargs in TINY.items():
        path = tmp_path_factory.mktemp(name)
        decoder_tokenizer().save_pretrained(path)
        kwargs = dict(kwargs)
        AutoConfig.for_model(kwargs.pop("model_type"), vocab_size=len(WORDS) + 2, bos_token_id=EOS,
                             eos_token_id=EOS, **kwargs).save_pretrained(path)
        out[name] = path
    return out


def token_file(path: Path, rows: int, seed: int) -> None:
    """Label 1 iff token SIGNAL occurs; rows of 4-19 tokens, so batches carry padding."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, rows)
    seqs = []
    for label in labels:
        seq = rng.choice([i for i in range(2, len(WORDS) + 2) if i != SIGNAL], rng.integers(4, 20))
        if label:
            seq[rng.integers(0, len(seq))] = SIGNAL
        seqs.append(seq.astype(np.int32))
    write_token_file(path, [TokenBatch(np.concatenate(seqs), np.array([len(s) for s in seqs],
                                                                      np.int32),
                                       labels, np.arange(rows))])


@pytest.fixture(scope="module")
def tokens(tmp_path_factory, model_dirs) -> Path:
    out = tmp_path_factory.mktemp("tokens")
    token_file(out / "train.arrow", 128, 0)
    token_file(out / "validation.arrow", 32, 1)
    load_tokenizer(str(model_dirs["gpt2"])).save_pretrained(out / "tokenizer")  # as tokenize does
    return out


def job_for(model_dir: Path, tokens: Path, **model) -> TrainJob:
    cfg = TrainConfig(epochs=1, lr=3e-3, global_batch_size=8, micro_batch_size=4, eval_every=8,
                      report_every=4, checkpoint_every=8, precision="fp32", seed=0,
                      warmup_ratio=0.0)
    return TrainJob(train=cfg, data=DataConfig(), model=ModelConfig(init="random", **model),
                    tokens_dir=tokens, model_source=str(model_dir), labels=("neg", "pos"),
                    pad_id=EOS)


class Collect:
    """A report sink keeping a copy of every checkpoint by step."""

    def __init__(self, out: Path):
        self.out, self.checkpoints = out, {}
        out.mkdir(parents=True, exist_ok=True)

    def __call__(self, metrics: dict, directory: Path | None) -> None:
        if directory:
            step = metrics["records"][-1]["step"]
            self.checkpoints[step] = shutil.copytree(directory, self.out / f"step_{step}")


def test_a_tokenizer_without_pad_pads_with_eos_and_says_so(model_dirs, caplog):
    with caplog.at_level(logging.INFO, logger="wellfed"):
        tok = load_tokenizer(str(model_dirs["llama"]))
    assert tok.pad_token == tok.eos_token == "<eos>" and tok.pad_token_id == EOS
    assert tok.padding_side == "right"
    assert "pad token = EOS '<eos>' (id 0)" in caplog.text
    batch = tok(["w1 w2 w3", "w4"], padding=True)["input_ids"]  # batches > 1 now pad
    assert batch == [[3, 4, 5], [6, EOS, EOS]]


def test_a_tokenizer_with_neither_pad_nor_eos_is_refused(tmp_path):
    tok = decoder_tokenizer()
    tok.eos_token = None
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="neither a pad nor an EOS token"):
        load_tokenizer(str(tmp_path))


def test_the_head_reads_the_last_real_token_padded_or_not(arch, model_dirs, tmp_path):
    """HF 5.x decoder heads take the rightmost token != pad_token_id (input ids, not the attention
    mask), so a row's logits are the same alone (no padding: dev.forward passes no mask) and
    right-padded in a batch. With pad == EOS a row's own trailing EOS counts as padding, the same
    in training and in `pipeline`: such a row reads as if the EOS were not there."""
    rows = [[5, 9, 13, 7], [21], [30, 31, EOS, 33, 34, 35], [5, 9, 13, 7, EOS]]
    write_token_file(tmp_path / "t.arrow", [TokenBatch(
        np.concatenate(rows).astype(np.int32), np.array([len(r) for r in rows], np.int32),
        np.zeros(len(rows), np.int64), np.arange(len(rows)))])
    data = TokenFile(tmp_path / "t.arrow")
    torch.manual_seed(0)
    model = load_model(ModelConfig(init="random"), str(model_dirs[arch]), ["a", "b"],
                       pad_id=EOS).eval()
    assert model.config.pad_token_id == EOS

    def logits(idx: list[int]) -> torch.Tensor:
        host = data.gather(np.array(idx), EOS, 8)  # right-padded with EOS to a multiple of 8
        with torch.no_grad():
            return dev.forward(model, dev.to_device(host, torch.device("cpu")), host)

    batch = logits([0, 1, 2, 3])
    alone = torch.cat([logits([i]) for i in range(len(rows))])
    assert data.gather(np.arange(4), EOS, 8)["input_ids"].shape == (4, 8)  # padding was there
    torch.testing.assert_close(batch, alone, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(alone[3], alone[0], atol=1e-5, rtol=1e-4)  # trailing EOS skipped
    assert not torch.allclose(alone[0], alone[1])  # rows differ: the check has teeth


def test_decoders_train_through_the_loop_with_padded_batches(arch, model_dirs, tokens, tmp_path):
    job = job_for(model_dirs[arch], tokens)
    job = dataclasses.replace(job, train=dataclasses.replace(job.train, epochs=2, lr=1e-3))
    state = train(job, CPU, Collect(tmp_path))
    losses = [h["loss"] for h in state.history]
    assert state.step == 32 and len(losses) == 32  # 2 epochs x 128 rows / 8
    assert all(np.isfinite(losses))
    # Measured: epoch 2 / epoch 1 mean loss = 0.82 (GPT-2), 0.58 (Llama)
    assert np.mean(losses[16:]) < 0.9 * np.mean(losses[:16]), losses
    assert any(h["padded_tokens"] > h["real_tokens"] for h in state.history)


def test_lora_config_problems_name_the_key():
    with pytest.raises(ValueError) as err:
        load_section({"model": {"lora_r": -1, "lora_dropout": 1.0, "lora_alpha": 0,
                                "lora_targets": "q_proj, v-proj"}}, "model")
    for key in ("model.lora_r", "model.lora_dropout", "model.lora_alpha", "model.lora_targets"):
        assert key in str(err.value), key
    assert load_section({"model": {"lora_r": 8, "lora_targets": "q_proj,v_proj"}},
                        "model").target_modules() == ["q_proj", "v_proj"]


def test_lora_targets_that_do_not_exist_fail_in_one_line(model_dirs):
    with pytest.raises(ValueError, match="model.lora_targets: none of nope is a module") as err:
        load_model(ModelConfig(init="random", lora_r=4, lora_targets="nope"),
                   str(model_dirs["llama"]), ["a", "b"], pad_id=EOS)
    assert "\n" not in str(err.value) and "q_proj" in str(err.value)


@pytest.mark.integration
def test_lora_trains_adapters_and_head_only_resumes_and_exports_merged(model_dirs, tokens,
                                                                      tmp_path, capsys):
    from transformers import AutoModelForSequenceClassification, pipeline

    from wellfed.train.outputs.export import write_model

    job = job_for(model_dirs["llama"], tokens, lora_r=4, lora_dropout=0.0)
    torch.manual_seed(job.train.seed)  # as train() does before load_model: the same init
    init = load_model(job.model, job.model_source, list(job.labels), EOS)
    trainable = sorted(n for n, p in init.named_parameters() if p.requires_grad)
    assert len(trainable) == 9  # q_proj and v_proj A, B in 2 layers + the score head
    assert all(".lora_" in n or "score.modules_to_save" in n for n in trainable), trainable

    full = Collect(tmp_path / "full")
    state = train(job, CPU, full)
    assert "parameters train (" in capsys.readouterr().out  # the one line rank 0 prints
    trained = torch.load(full.checkpoints[16] / checkpoint.MODEL, weights_only=True)
    before = init.state_dict()
    frozen = [k for k in before if k not in {n for n in trainable}]
    assert len(frozen) > 20 and all(torch.equal(before[k], trained[k]) for k in frozen)
    assert all(not torch.equal(before[k], trained[k]) for k in trainable)  # lora_B starts at 0

    stops = iter([False] * 7 + [True])  # stopped after step 8, then resumed
    first = Collect(tmp_path / "first")
    assert train(job, CPU, first, stop=lambda: next(stops)).step == 8
    resumed = train(job, CPU, Collect(tmp_path / "second"), resume=first.checkpoints[8])
    np.testing.assert_allclose([h["loss"] for h in resumed.history],
                               [h["loss"] for h in state.history], rtol=1e-5)

    out = tmp_path / "model"
    write_model(full.checkpoints[16], job, tokens, out)  # the export: model.pt, adapters merged
    assert not (out / "adapter_config.json").exists()
    merged, info = AutoModelForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info  # no missing/unexpected (lora_, base_layer) keys
    peft_model = load_model(job.model, job.model_source, list(job.labels), EOS)
    peft_model.load_state_dict(trained)
    ids = torch.tensor([[5, 9, SIGNAL, 7], [30, 31, EOS, EOS]])
    with torch.no_grad():
        torch.testing.assert_close(merged.eval()(input_ids=ids).logits,
                                   peft_model.eval()(input_ids=ids).logits, atol=1e-5, rtol=1e-4)
    preds = pipeline("text-classification", model=str(out), device="cpu")(
        ["w3 w38 w5", "w7"], batch_size=2)
    assert [p["label"] for p in preds] and {p["label"] for p in preds} <= {"neg", "pos"}
    # A process where peft cannot be imported loads the export all the same.
    code = ("import sys; sys.modules['peft'] = None\n"
            "from transformers import AutoModelForSequenceClassification as A\n"
            f"m = A.from_pretrained({str(out)!r}); print(type(m).__name__, m.config.pad_token_id)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.stdout.split() == ["LlamaForSequenceClassification", "0"], done.stderr[-2000:]


def test_lora_under_ddp_needs_no_find_unused_parameters(model_dirs, tokens, tmp_path):
    """DDP (as Ray's prepare_model wraps it: find_unused_parameters=False) with frozen weights:
    it only reduces parameters that require grad, and every adapter and head weight gets one."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    job = job_for(model_dirs["gpt2"], tokens, lora_r=4)
    job = dataclasses.replace(job, train=dataclasses.replace(job.train, max_steps=3))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        state = train(job, CPU, Collect(tmp_path / "ckpt"),
                      wrap=lambda m: DistributedDataParallel(m, find_unused_parameters=False))
    finally:
        dist.destroy_process_group()
    assert state.step == 3 and all(np.isfinite(h["loss"]) for h in state.history)
    from wellfed.train.outputs.export import write_hf

    write_hf(tmp_path / "ckpt" / "step_3", job, tmp_path / "export")
    merged = json.loads((tmp_path / "export" / "config.json").read_text())
    assert merged["pad_token_id"] == EOS and merged["architectures"] == ["GPT2ForSequenceClassification"]
