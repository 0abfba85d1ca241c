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
    """AdamW + schedule + gradient clipping for K trials at once."""

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]], recipes: list[Recipe],
                 steps: int):
        self.named, self.recipes = named, list(recipes)
        self.schedules = [schedule(r, steps) for r in recipes]
        self.state = [(torch.zeros_like(p), torch.zeros_like(p)) for _, p in named]
        self.step_count = 0

    def lrs(self) -> list[float]:
        """Each trial's learning rate for the step about to be taken."""
        return [s.get_last_lr()[0] for s in self.schedules]

    def _per_trial(self, values: list[float], like: torch.Tensor) -> torch.Tensor:
        return torch.tensor(values, dtype=like.dtype, device=like.device).reshape(
            -1, *([1] * (like.ndim - 1)))

    def clip(self) -> torch.Tensor:
        """Clip each trial's gradients to its max_grad_norm (0 = never); returns each trial's
        norm before clipping, (K,), as clip_grad_norm_ reports it alone."""
        grads = [p.grad for _, p in self.named if p.grad is not None]
        norms = torch.stack([g.reshape(g.shape[0], -1).norm(dim=1) for g in grads])
        total = norms.norm(dim=0)
        limits = torch.tensor([r.max_grad_norm or float("inf") for r in self.recipes],
                              dtype=total.dtype, device=total.device)
        coef = torch.clamp(limits / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.reshape(-1, *([1] * (g.ndim - 1))).to(g.dtype))
        return total

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        b1, b2 = BETAS
        c1, c2 = 1 - b1 ** self.step_count, (1 - b2 ** self.step_count) ** 0.5
        lrs = self.lrs()
        for (name, p), (avg, sq) in zip(self.named, self.state):
            if p.grad is None:
                continue
            lr = self._per_trial(lrs, p)
            if decays(name, p.ndim - 1):
                wd = self._per_trial([r.weight_decay for r in self.recipes], p)
                p.mul_(1 - lr * wd)
            avg.lerp_(p.grad, 1 - b1)
            sq.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            p.sub_(lr / c1 * avg / (sq.sqrt() / c2 + EPS))
        for s in self.schedules:
            s.optimizer.step()  # the stand-in (no gradient: a no-op), as the order asks
            s.step()

    def zero_grad(self) -> None:
        for _, p in self.named:
            p.grad = None

    def keep(self, trials: list[int], named: list[tuple[str, torch.nn.Parameter]]) -> None:
        """Keep these trials' optimizer state (in this order) for the kept parameters `named`."""
        index = torch.as_tensor(trials, dtype=torch.long)
        self.state = [(a[index.to(a.device)].clone(), s[index.to(s.device)].clone())
                      for a, s in self.state]
        self.named = named
        self.recipes = [self.recipes[k] for k in trials]
        self.schedules = [self.schedules[k] for k in trials]
