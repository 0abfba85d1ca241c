"""AdamW over the trial dimension: each trial stepped as `torch.optim.AdamW` with the HF linear
warmup-and-decay schedule steps it alone (train/step/setup.py builds that pair for one run).

Every parameter has the trial dimension first; a trial's learning rate, weight decay and
clipping norm are its own. Decay applies where a trial alone applies it: weights of two or more
dimensions that are not norms (build_optimizer's rule, on the original parameter names).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BETAS, EPS = (0.9, 0.999), 1e-8  # torch.optim.AdamW's defaults, which a run alone uses


@dataclass(frozen=True)
class Recipe:
    """What the update of one trial reads from its train section."""

    lr: float
    weight_decay: float
    warmup_ratio: float
    max_grad_norm: float


def schedule(recipe: Recipe, steps: int):
    """The HF schedule a run alone steps (transformers' get_linear_schedule_with_warmup), on a
    stand-in optimizer: its learning rates are the trial's, to every digit."""
    from transformers import get_linear_schedule_with_warmup

    stand_in = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=recipe.lr)
    return get_linear_schedule_with_warmup(stand_in, int(recipe.warmup_ratio * steps), steps)


def decays(name: str, ndim: int) -> bool:
    return not (ndim < 2 or "LayerNorm" in name or "norm" in name)


class TrialAdamW:
    """AdamW + schedule + gradient clipping for K trials at once. Each trial's slice of every
    weight is stepped by torch's own AdamW (its functional form, `torch.optim.adamw.adamw`, the
    fused kernel where the device has one, as train/setup.py's optimizer) and clipped as
    `clip_grad_norm_` clips (torch.nn.utils.get_total_norm, then the clamped coefficient): the
    same arithmetic as the trial alone, on views of the stacked tensors, in two calls a trial."""

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]], recipes: list[Recipe],
                 steps: int):
        self.named, self.recipes = named, list(recipes)
        self.schedules = [schedule(r, steps) for r in recipes]
        self.avg = [torch.zeros_like(p) for _, p in named]
        self.sq = [torch.zeros_like(p) for _, p in named]
        self.decay = [decays(name, p.ndim - 1) for name, p in named]
        self.limits: torch.Tensor | None = None
        """Each trial's max_grad_norm (0: inf) on the device, made at the first `clip`."""
        device = named[0][1].device
        self.fused = device.type in ("cpu", "cuda")
        # one step count per trial and weight, as AdamW keeps one per parameter (float32 on the
        # weight's device for the fused kernel)
        self.counts = [[torch.zeros((), dtype=torch.float32, device=p.device) for _, p in named]
                       for _ in recipes]

    def lrs(self) -> list[float]:
        """Each trial's learning rate for the step about to be taken."""
        return [s.get_last_lr()[0] for s in self.schedules]

    @torch.no_grad()
    def clip(self) -> torch.Tensor:
        """Clip each trial's gradients to its max_grad_norm (0 = never); returns each trial's
        norm before clipping, (K,), as clip_grad_norm_ computes it alone (the 2-norm of the
        weights' 2-norms, then the clamped coefficient), in a few kernels a weight whatever K:
        each weight's K norms at once, each trial's coefficient broadcast over its slice."""
        grads = [p.grad for _, p in self.named if p.grad is not None]
        k = grads[0].shape[0]
        each = torch.stack([g.reshape(k, -1).norm(dim=1) for g in grads], dim=1)  # (K, weights)
        totals = each.norm(dim=1)
        if self.limits is None:  # once, not a host-to-device copy every step
            self.limits = torch.tensor([r.max_grad_norm or float("inf") for r in self.recipes],
                                       dtype=totals.dtype, device=totals.device)
        coefs = torch.clamp(self.limits / (totals + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coefs.reshape(k, *[1] * (g.ndim - 1)).to(g.dtype))
        return totals

    @torch.no_grad()
    def step(self) -> None:
        from torch.optim.adamw import adamw

        for k, (recipe, lr) in enumerate(zip(self.recipes, self.lrs())):
            for decaying in (True, False):
                at = [i for i, (_, p) in enumerate(self.named)
                      if self.decay[i] == decaying and p.grad is not None]
                if not at:
                    continue
                adamw([self.named[i][1][k] for i in at], [self.named[i][1].grad[k] for i in at],
                      [self.avg[i][k] for i in at], [self.sq[i][k] for i in at], [],
                      [self.counts[k][i] for i in at], fused=self.fused or None,
                      amsgrad=False, beta1=BETAS[0], beta2=BETAS[1], lr=lr,
                      weight_decay=recipe.weight_decay if decaying else 0.0, eps=EPS,
                      maximize=False)
        for s in self.schedules:
            s.optimizer.step()  # the stand-in (no gradient: a no-op), as the order asks
            s.step()

    def zero_grad(self) -> None:
        for _, p in self.named:
            p.grad = None

    def keep(self, trials: list[int], named: list[tuple[str, torch.nn.Parameter]]) -> None:
        """Keep these trials' optimizer state (in this order) for the kept parameters `named`."""
        index = torch.as_tensor(trials, dtype=torch.long)
        self.avg = [a[index.to(a.device)].clone() for a in self.avg]
        self.sq = [s[index.to(s.device)].clone() for s in self.sq]
        self.named = named
        self.recipes = [self.recipes[k] for k in trials]
        self.limits = None
        self.schedules = [self.schedules[k] for k in trials]
        self.counts = [self.counts[k] for k in trials]

    def state(self) -> dict:
        """What `load` puts back: the moments, step counts and schedules of the trials alive."""
        return {"avg": [a.detach().cpu() for a in self.avg],
                "sq": [s.detach().cpu() for s in self.sq],
                "counts": [[c.detach().cpu() for c in trial] for trial in self.counts],
                "schedules": [s.state_dict() for s in self.schedules]}

    def load(self, state: dict) -> None:
        """Put back what `state` returned (for the same trials, in the same order)."""
        self.avg = [a.to(p.device) for a, (_, p) in zip(state["avg"], self.named)]
        self.sq = [s.to(p.device) for s, (_, p) in zip(state["sq"], self.named)]
        self.counts = [[c.to(p.device) for c, (_, p) in zip(trial, self.named)]
                       for trial in state["counts"]]
        for schedule, saved in zip(self.schedules, state["schedules"]):
            schedule.load_state_dict(saved)
