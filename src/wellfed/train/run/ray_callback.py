"""Ray Train's side of the driver's callbacks (train/outputs/callback.py): imported on the Ray path
only, so in-process training never imports Ray."""

from __future__ import annotations

import ray.train


class RayCallback(ray.train.UserCallback):
    """A train/outputs/callback.py callback as a Ray Train UserCallback: the controller's reports go
    to it unchanged."""

    def __init__(self, callback):
        self.callback = callback

    def after_report(self, run_context, metrics: list[dict], checkpoint) -> None:
        self.callback.after_report(run_context, metrics, checkpoint)
