"""Label text -> a key safe wherever a name is required: metric keys, column and file names.

A label can be any text (`reverted_card_payment?`, `card/lost`, `naïve café`), but MLflow
rejects metric keys with `?`, a `/` nests a key (`eval/card/lost/f1`), a `.` nests a key in
`dvc metrics show` (`per_class.a.b.f1`), and a space or `/` is a poor file name. `keys` maps every
label to letters, digits, `_` and `-` (Unicode letters kept, as MLflow allows them) and keeps
distinct labels distinct; the original text stays beside the key (labels.json, the model's
id2label, predictions, the per-class `label` in the metrics).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from typing import Iterable

UNSAFE = re.compile(r"[^\w-]+")  # \w: Unicode letters and digits and _, as MLflow's own check
MAX_CHARS = 60  # eval/<key>/precision stays far below MLflow's 250; 60 4-byte chars < 255 bytes


def key(label) -> str:
    """`label` itself when it is safe; else each run of unsafe characters as one `_` (none at
    the ends), cut to MAX_CHARS. Not yet distinct from other labels' keys: see `keys`."""
    text = str(label)
    if text and len(text) <= MAX_CHARS and UNSAFE.search(text) is None:
        return text
    text = UNSAFE.sub("_", unicodedata.normalize("NFC", text)).strip("_")
    return text[:MAX_CHARS] or "label"


def keys(labels: Iterable) -> list[str]:
    """One distinct safe key per label, in order. A label that is already safe keeps its text; a
    changed one keeps its cleaned text unless another label cleans to the same, and then gets a
    short suffix from a hash of its original text (`refund?` -> `refund-1a2b3c` beside `refund`)."""
    texts = [str(label) for label in labels]
    repeated = sorted(t for t, n in Counter(texts).items() if n > 1)
    if repeated:
        raise ValueError(f"label names must be distinct; repeated: {repeated}")
    base = [key(text) for text in texts]
    shared = Counter(base)
    out = [b if b == text or shared[b] == 1 else f"{b}-{digest(text, 6)}"
           for text, b in zip(texts, base)]
    taken = Counter(out)
    # Only a label spelled exactly like another's suffixed key is left: the full hash settles it.
    return [k if taken[k] == 1 or k == text else f"{b}-{digest(text, 40)}"
            for k, text, b in zip(out, texts, base)]


def digest(text: str, chars: int) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:chars]
