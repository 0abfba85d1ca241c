"""Environment variables set for a while and put back as they were (unset ones unset again)."""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def scoped(values: dict[str, str], keep: tuple[str, ...] = ()):
    """Set `values` for the block; afterwards `values`' keys and `keep`'s (variables something in
    the block may set) are restored to what they were before it."""
    keys = (*values, *keep)
    saved = {key: os.environ.get(key) for key in keys}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
