"""A Hugging Face Hub model id: loaded from the local cache without the network, else looked up
on the Hub once, with a short timeout.

Offline by default: transformers asks the Hub about every file of a model before it reads the
cached copy, and an unreachable Hub costs huggingface_hub's retries each time (1 + 2 + 4 + 8 +
8 s). Measured here with HF_HUB_OFFLINE unset and no network: 48 s before the error for a model
that is not cached (which then blamed disk space and permissions), 96 s to load a cached
tokenizer. So a cached model loads with `local_files_only` (no request at all), and one that is
not cached is looked up once (`model_info`, TIMEOUT s, no retries) before anything downloads:
there -> transformers downloads it as usual; no such model, gated, or no network -> one line
that says which, in seconds. A cached model is used as it is, never re-checked against the Hub:
`hf download <id>` refreshes it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")

TIMEOUT = 10.0
"""Seconds the Hub lookup may take (a refused connection or an unknown host fails at once)."""


def offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it (1, ON, YES, TRUE in any case)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def cached(repo_id: str) -> bool:
    """Whether the local Hub cache holds `repo_id`'s config.json (it was loaded here before)."""
    return cached_folder(repo_id) is not None


def cached_folder(repo_id: str) -> Path | None:
    """The cached snapshot folder of `repo_id` (its config.json's folder), or None."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def check(repo_id: str) -> None:
    """Return when the Hub has `repo_id` and lets us download it; else raise the one line that
    says why not: no such model (or private), gated, the Hub's own error, or no network."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    from wellfed.errors import StageError

    where = f"the Hugging Face Hub ({constants.ENDPOINT})"
    try:
        HfApi().model_info(repo_id, timeout=TIMEOUT)
    except GatedRepoError:
        raise ValueError(f"model.name: {repo_id!r} is gated on {where}: accept its terms on its "
                         "page, log in (`hf auth login`), then rerun; or use a local model "
                         "directory") from None
    except RepositoryNotFoundError:
        raise ValueError(f"model.name: {where} has no model {repo_id!r} (or it is private and "
                         "this machine is not logged in: `hf auth login`); check the name, or "
                         "use 'default' or a local model directory") from None
    except HfHubHTTPError as err:
        status = getattr(err.response, "status_code", "an error")
        raise StageError(f"model.name: {where} answered {status} when asked for {repo_id!r}; "
                         "try again later, or use a local model directory") from None
    except Exception as err:  # no network, DNS, a proxy, a timeout: the Hub cannot be reached
        raise StageError(
            f"model.name: {repo_id!r} is not in the Hugging Face cache ({cache_dir()}) and "
            f"{where} cannot be reached ({type(err).__name__}: {err}); connect this machine "
            "and rerun, or use 'default' or a local model directory") from None


def not_available_offline(repo_id: str) -> ValueError:
    return ValueError(
        f"model.name: {repo_id!r} is not a local directory nor in the Hugging Face cache "
        f"({cache_dir()}), and HF_HUB_OFFLINE is on, so the Hub cannot be reached; use "
        f"'default' or a local directory, or download it once: HF_HUB_OFFLINE=0 hf download "
        f"{repo_id}")


def pretrained(load: Callable[..., T], source: str, **kwargs) -> T:
    """`load(source, **kwargs)` (a transformers `from_pretrained`). A Hub id cached here loads
    from the cache alone; one that is not (or not every file a load needs: the tokenize stage
    fetched the tokenizer, training needs the weights) is looked up first (`check`), then
    downloaded as transformers does."""
    if Path(source).is_dir():
        return load(source, **kwargs)
    if offline() or cached(source):
        try:
            return load(source, local_files_only=True, **kwargs)
        except OSError:  # a file this load needs is not in the cache
            if offline():
                raise
    check(source)
    return load(source, **kwargs)
