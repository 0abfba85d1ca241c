"""The trial dimension in a transformers model: K copies of every weight, one forward.

A fused batch holds K blocks, block k for trial k (rows k*B .. k*B+B-1). Weight modules read
their block with their own weights.

- Trials of one seed share their micro-batch (the K blocks are copies of it): dropout draws one
  mask for a block and applies it to all K (each trial alone would have drawn that very mask);
  attention runs as the model's own attention function, per block when it drops out (the
  generator rewound to the same state for each block) and on the whole batch otherwise.
- Trials of different seeds (the final check) each bring their own micro-batch, padded to one
  shape (trials/apart.py): each block's own shape, the (rows, width) the trial alone computes,
  is known, and dropout and attention run on each block's own region with the trial's own
  random state (`Streams`), so each draws what it draws alone; what lies outside the region is
  padding, which no real token attends to and no loss reads.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from wellfed.train.trials.apart import Streams, get_state, set_state

FUSABLE = (nn.Linear, nn.Embedding, nn.LayerNorm)
"""The weight modules a trial dimension is given to; a model with any other refuses fusion."""


@dataclass
class Fused:
    """The forward under way: K trials of `rows` rows each."""

    trials: int
    rows: int
    own: list[tuple[int, int]] | None = None
    """Each block's own (rows, width) where the trials bring their own batches ((0, 0): the trial
    has no micro-batch here); None: the blocks are copies of one micro-batch."""
    masked: list[bool] | None = None
    """Whether each block's own batch has padding (its attention then takes a mask, as alone)."""
    streams: Streams | None = None
    """Each trial's own random state (trials/apart.py), with `own`."""


def region(block: torch.Tensor, shape: tuple[int, int]) -> tuple:
    """The index of a block's own region, by the layouts transformers' encoders drop out: a
    pooled state (rows, dim), a hidden state (rows, width, dim), attention probabilities
    (rows, heads, width, width). Any other layout is refused rather than guessed."""
    rows, width = shape
    r, w = slice(0, rows), slice(0, width)
    if block.ndim == 2:
        return (r,)
    if block.ndim == 3:
        return (r, w)
    if block.ndim == 4:
        return (r, slice(None), w, w)
    raise ValueError(f"fused trials of different seeds cannot drop out a tensor of "
                     f"{block.ndim} dimensions {tuple(block.shape)}: train these trials "
                     "one by one (search.fuse: false)")


_current: contextvars.ContextVar[Fused | None] = contextvars.ContextVar("wellfed_fused",
                                                                        default=None)


def current() -> Fused:
    fused = _current.get()
    if fused is None:
        raise RuntimeError("a trial layer ran outside TrialModel.forward")
    return fused


def stacked(modules: list[nn.Module], name: str) -> nn.Parameter | None:
    first = getattr(modules[0], name)
    if first is None:
        return None
    return nn.Parameter(torch.stack([getattr(m, name).detach() for m in modules]).clone())


class TrialLinear(nn.Module):
    """K Linear layers: weight (K, out, in), bias (K, out); one batched matmul."""

    def __init__(self, copies: list[nn.Linear]):
        super().__init__()
        self.weight, self.bias = stacked(copies, "weight"), stacked(copies, "bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.weight.shape[0]
        if k == 1:  # a group of one: the Linear a trial alone runs
            return F.linear(x, self.weight[0], None if self.bias is None else self.bias[0])
        flat = x.reshape(k, -1, x.shape[-1])
        if self.bias is None:
            out = torch.bmm(flat, self.weight.transpose(1, 2))
        else:
            out = torch.baddbmm(self.bias[:, None, :], flat, self.weight.transpose(1, 2))
        return out.reshape(*x.shape[:-1], out.shape[-1])


class TrialEmbedding(nn.Module):
    """K Embedding tables: weight (K, rows, dim), looked up as one table of K x rows (trial k's
    ids offset by k x rows: one gather whatever K). Ids with one row (the position ids
    transformers broadcasts over the batch) give every trial's block its rows; padding_idx as
    the original: its row gets no gradient."""

    def __init__(self, copies: list[nn.Embedding]):
        super().__init__()
        self.weight = stacked(copies, "weight")
        self.padding_idx = copies[0].padding_idx

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        f = current()
        if ids.shape[0] == 1 and f.trials * f.rows != 1:  # broadcast ids: one row for all
            out = torch.stack([F.embedding(ids[0], w, self.padding_idx) for w in self.weight])
            return out[:, None].expand(-1, f.rows, *out.shape[1:]).reshape(
                f.trials * f.rows, *out.shape[1:])
        if f.trials == 1:
            return F.embedding(ids, self.weight[0], self.padding_idx)
        k, rows = self.weight.shape[:2]
        blocks = ids.reshape(k, -1, *ids.shape[1:])
        offsets = (torch.arange(k, device=ids.device) * rows).reshape(k, *[1] * (ids.ndim))
        out = F.embedding(blocks + offsets, self.weight.reshape(k * rows, -1))
        if self.padding_idx is not None:  # no gradient to the padding row, as alone
            out = torch.where((blocks == self.padding_idx)[..., None], out.detach(), out)
        return out.reshape(*ids.shape, -1)


class TrialLayerNorm(nn.Module):
    """K LayerNorms: the normalisation once over the batch, each block's own scale and shift."""

    def __init__(self, copies: list[nn.LayerNorm]):
        super().__init__()
        self.weight, self.bias = stacked(copies, "weight"), stacked(copies, "bias")
        self.shape, self.eps = copies[0].normalized_shape, copies[0].eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = current().trials
        if k == 1:
            return F.layer_norm(x, self.shape, self.weight[0],
                                None if self.bias is None else self.bias[0], self.eps)
        blocks = F.layer_norm(x, self.shape, None, None, self.eps).reshape(k, -1, *x.shape[1:])
        view = (k,) + (1,) * (blocks.ndim - 1 - len(self.shape)) + tuple(self.shape)
        if self.bias is None:
            return (blocks * self.weight.reshape(view)).reshape(x.shape)
        return torch.addcmul(self.bias.reshape(view), blocks,
                             self.weight.reshape(view)).reshape(x.shape)


class TrialDropout(nn.Module):
    """Dropout drawn as a trial alone draws it. Trials of one seed: one mask of the block's
    shape (the generator's next draw for a tensor of that shape), applied to every trial's
    block. Trials of different seeds: each block's own mask, of its own region's shape, from
    its trial's own stream."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        f = current()
        blocks = x.reshape(f.trials, -1, *x.shape[1:])
        if f.own is None:
            mask = F.dropout(torch.ones_like(blocks[0]), self.p, True)
            return (blocks * mask).reshape(x.shape)
        masks = torch.ones_like(blocks)
        for k, shape in enumerate(f.own):
            if shape[0]:  # a trial without a micro-batch here draws nothing, as alone
                where = region(blocks[k], shape)
                with f.streams.use(k):
                    masks[k][where] = F.dropout(torch.ones_like(blocks[k][where]), self.p, True)
        return (blocks * masks).reshape(x.shape)


@contextlib.contextmanager
def rewinding(device: torch.device):
    """Yields `rewind()`, which sets the device's generator back to its state on entry."""
    state = get_state(device)
    yield lambda: set_state(state, device)


def trial_attention(inner):
    """The model's own attention function `inner`, run per trial block when it drops out."""

    def attention(module, query, key, value, attention_mask, dropout: float = 0.0, **kwargs):
        f = current()
        if f.own is not None:
            return apart(module, query, key, value, attention_mask, dropout, kwargs)
        if not dropout:
            return inner(module, query, key, value, attention_mask, dropout=dropout, **kwargs)
        split = [t.reshape(f.trials, -1, *t.shape[1:]) for t in (query, key, value)]
        masks = (attention_mask.reshape(f.trials, -1, *attention_mask.shape[1:])
                 if attention_mask is not None and attention_mask.shape[0] == query.shape[0]
                 else [attention_mask] * f.trials)
        outs, weights = [], []
        with rewinding(query.device) as rewind:
            for k in range(f.trials):
                rewind()  # each block draws what trial k alone would: the same draw for all
                out, w = inner(module, split[0][k], split[1][k], split[2][k], masks[k],
                               dropout=dropout, **kwargs)
                outs.append(out)
                weights.append(w)
        return torch.cat(outs), None if weights[0] is None else torch.cat(weights)

    def apart(module, query, key, value, attention_mask, dropout, kwargs):
        """Each block's own region (rows, heads, width, dim) alone, with the trial's own
        random state and, where its batch is padded, its own part of the mask; the output,
        (rows, width, heads, dim), is 0 outside the region."""
        f = current()
        width = query.shape[2]
        split = [t.reshape(f.trials, -1, *t.shape[1:]) for t in (query, key, value)]
        masks = (attention_mask.reshape(f.trials, -1, *attention_mask.shape[1:])
                 if attention_mask is not None else None)
        out = None
        for k, (rows, own) in enumerate(f.own):
            if not rows:
                continue
            q, kk, v = (t[k][:rows, :, :own] for t in split)
            mask = None
            if f.masked[k] and masks is not None:
                mask = masks[k][:rows, ..., :own]
                if mask.shape[-2] == width:
                    mask = mask[..., :own, :]
            with f.streams.use(k):
                got, _ = inner(module, q, kk, v, mask, dropout=dropout, **kwargs)
            if out is None:
                out = got.new_zeros(f.trials, split[0].shape[1], width, *got.shape[2:])
            out[k, :rows, :own] = got
        return out.reshape(-1, *out.shape[2:]), None

    return attention


def with_trial_attention(model) -> None:
    """Register the model's attention function, run per trial block, under a name of its own
    (transformers' AttentionInterface and AttentionMaskInterface, public API) and switch the
    model to it; the mask is the one the model's own attention takes."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    own = model.config._attn_implementation
    name = f"wellfed_trials_{own}"
    if own == "eager":  # not in the interface: each modeling file has its own
        import importlib

        inner = importlib.import_module(type(model).__module__).eager_attention_forward
    else:
        inner = AttentionInterface()[own]
    AttentionInterface.register(name, trial_attention(inner))
    AttentionMaskInterface.register(name, AttentionMaskInterface()[own])
    model.set_attn_implementation(name)


def refusal(model) -> str | None:
    """Why `model` cannot be fused (one line), or None."""
    seen = {}
    for name, module in model.named_modules():
        own = list(module.named_parameters(recurse=False))
        if own and not isinstance(module, FUSABLE):
            return (f"{name} is a {type(module).__name__}, a weight module that fused trials "
                    "do not know (they fuse Linear, Embedding and LayerNorm): train these "
                    "trials one by one (search.fuse: false)")
        for pname, param in own:
            if not param.requires_grad:
                return (f"{name}.{pname} is frozen (an adapter model, e.g. LoRA): fused trials "
                        "train every weight; train these trials one by one")
            if id(param) in seen:
                return (f"{name}.{pname} is the same weight as {seen[id(param)]} (tied "
                        "weights): fused trials train untied models; search.fuse: false")
            seen[id(param)] = f"{name}.{pname}"
    return None


class TrialModel(nn.Module):
    """K trials of one transformers classifier as one module: `forward` takes one micro-batch
    and returns each trial's logits, (K, rows, classes)."""

    def __init__(self, model, trials: int):
        super().__init__()
        why = refusal(model)
        if why:
            raise ValueError(why)
        self.model, self.trials = model, trials
        for name, module in list(model.named_modules()):
            if isinstance(module, (nn.Linear, nn.Embedding, nn.LayerNorm, nn.Dropout)):
                parent_name, _, child = name.rpartition(".")
                parent = model.get_submodule(parent_name) if parent_name else model
                setattr(parent, child, trial_module(module, trials))
        with_trial_attention(model)

    streams: Streams | None = None
    """Each trial's own random state, where the trials' seeds differ (trials/apart.py)."""

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, own=None,
                masked=None) -> torch.Tensor:
        """Each trial's logits for one micro-batch, or with `own` (each trial's own (rows,
        width), `masked` whether it is padded: trials/apart.py's `stacked`) for the K trials'
        own micro-batches, one block each, padded to one shape."""
        if own is not None:
            rows = input_ids.shape[0] // self.trials
            fused = Fused(self.trials, rows, own, masked, self.streams)
        else:
            rows = input_ids.shape[0]
            reps = (self.trials,) + (1,) * (input_ids.ndim - 1)
            input_ids, attention_mask, token_type_ids = (
                None if t is None else t.repeat(reps)
                for t in (input_ids, attention_mask, token_type_ids))
            fused = Fused(self.trials, rows)
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        token = _current.set(fused)
        try:
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                **extra).logits
        finally:
            _current.reset(token)
        return logits.reshape(self.trials, rows, -1)

    def keep(self, trials: list[int]) -> None:
        """Keep these trials' slices of every weight (in this order), drop the others."""
        index = torch.as_tensor(trials, dtype=torch.long)
        for module in self.model.modules():
            for name, param in list(module.named_parameters(recurse=False)):
                setattr(module, name, nn.Parameter(param.detach()[index.to(param.device)]
                                                   .clone(), param.requires_grad))
        self.trials = len(trials)
        if self.streams is not None:
            self.streams.keep(trials)

    def load_trial(self, k: int, model: nn.Module) -> None:
        """Trial k's weights from `model` (the same architecture, e.g. initialised with
        another seed)."""
        own = dict(model.named_parameters())
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                param[k].copy_(own[name].to(param.device))

    def trial_state(self, k: int) -> dict[str, torch.Tensor]:
        """Trial k's weights under the original model's parameter names."""
        return {name: param.detach()[k] for name, param in self.model.named_parameters()}


def trial_module(module: nn.Module, trials: int) -> nn.Module:
    if isinstance(module, nn.Dropout):
        return TrialDropout(module.p)
    copies = [module] + [copy.deepcopy(module) for _ in range(trials - 1)]
    if isinstance(module, nn.Linear):
        return TrialLinear(copies)
    if isinstance(module, nn.Embedding):
        return TrialEmbedding(copies)
    return TrialLayerNorm(copies)
