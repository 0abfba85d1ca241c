"""A stage's Python heap. What a stage's process has built to do its work (torch, transformers,
MLflow, the model) stays until the process exits, yet every full collection of the garbage
collector walks all of it again: ~0.3 s a pass once torch, transformers and MLflow are in, a few
passes while a stage runs and more at interpreter exit (1.5 s after a train stage had finished,
1.0 s after evaluate). Settling moves everything that exists now out of the collector's sight
(`gc.freeze`): later collections walk only what comes after, and the process exits at once.

Only for a process that will soon end or keeps what it has (a stage, a command), never inside a
library call: frozen objects that later become garbage in a cycle are not collected.
"""

from __future__ import annotations

import gc


def settle() -> None:
    """Everything the process holds now is kept until it exits: the collector skips it."""
    gc.freeze()
