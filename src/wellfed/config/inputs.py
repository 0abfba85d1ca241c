"""`prepare` and `tokenize`: where the labelled text comes from and how it is read, split
and tokenized."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class PrepareConfig:
    """`prepare`: where the raw labelled text comes from, how it is read and how it is split."""

    train: str = "train.tsv"
    """Train file inside the raw folder (a dvc.yaml argument), or the split name with `hub_dataset`."""
    validation: str = "dev.tsv"
    """Validation file or split name; "" carves `val_fraction` of train, stratified and seeded."""
    test: str = "test.tsv"
    """Labelled test file or split name; "" evaluates on the validation split."""
    format: Literal["auto", "csv", "tsv", "jsonl", "parquet"] = "auto"
    """File format; auto = from the extension, else sniffed from the content (no extension)."""
    header: bool = True
    """CSV/TSV: line 1 names the columns; false = every line is data, columns go by position."""
    quoting: Literal["auto", "none", "csv"] = "auto"
    """CSV/TSV quotes: csv = RFC 4180 ("..." may hold delimiters, newlines, "" for a quote);
    none = quotes are plain characters (many TSV exports; GLUE's own loader reads its TSVs so);
    auto = csv unless the file only parses with quotes as plain characters."""
    text_column: str | int | list = "sentence"
    """Column holding the input text: its name, or its 0-based position (needed with header: false).
    A list of two columns is a sentence pair ([premise, hypothesis]), encoded as one input."""
    label_column: str | int | list = "label"
    """Column holding the label: a name or a 0-based position. Single-label: any strings or
    integers; multi-label: a list (JSONL/Parquet) or a `label_delimiter`-separated string;
    regression: numbers (a list of columns = several targets). A label in `missing_labels` is
    missing, handled by `on_invalid`."""
    missing_labels: list = dataclasses.field(default_factory=lambda: ["", "NaN", "null", "None"])
    """Label spellings that mean "this row has no label" (compared stripped, in any case),
    handled by `on_invalid` (error, or skip and count them per spelling in the data report).
    The whole list: keep the defaults when adding, e.g. SNLI's `-` (pairs without annotator
    agreement) and Hugging Face's `-1` (unlabelled rows): ["", "NaN", "null", "None", "-",
    "-1"]. A cell with no value at all is always missing. A label that looks like a marker and
    is not listed (`-`, `?`, `N/A`, `unknown`, ...; a punctuation character or a negative
    integer under 2% of train rows) gets one warning naming this key."""
    task: Literal["auto", "single_label", "multi_label", "regression"] = "auto"
    """What the labels are; auto = inferred from train's labels and said in one line: lists or
    delimited labels whose parts also occur alone -> multi_label, numbers that are not all
    integers -> regression, anything else -> single_label."""
    label_delimiter: str = ","
    """Multi-label in CSV/TSV: the character between a row's labels (`2,17`)."""
    allow_outside: bool = False
    """Read `train`, `validation` and `test` where they resolve even outside the raw folder (an
    absolute path, a `..`, or a link in the raw folder to a file elsewhere); false refuses such
    a file before a byte of it is read, naming the key and the fix. DVC tracks the raw folder
    only: a file named outside it directly is not tracked (a change to it does not rerun
    prepare, and each run warns); a link in the raw folder to it is (DVC hashes what a link
    points to)."""
    hub_dataset: str = ""
    """Hugging Face Hub dataset id (needs network); when set the raw folder is not read."""
    hub_config: str = ""
    """Hub dataset configuration name, e.g. sst2 for nyu-mll/glue."""
    val_fraction: float = 0.1
    """Share of train carved out as validation when `validation` is ""; a text and its
    duplicates always land on the same side."""
    seed: int = 42
    """Seed of the validation carve-out."""
    drop_duplicates: bool = False
    """Drop repeated (text, label) rows inside a split; they are counted in the report either way."""
    on_invalid: Literal["error", "skip"] = "error"
    """What to do with an empty text or a missing label: stop with the row named, or skip and count it."""
    on_conflict: Literal["error", "keep", "drop"] = "keep"
    """The same text with different labels in one split: stop with the rows named, keep the rows
    (counted and warned about), or drop every such row."""

    def problems(self) -> list[str]:
        out = []
        if not 0.0 < self.val_fraction < 0.5:
            out.append(f"prepare.val_fraction must be in (0, 0.5); got {self.val_fraction}")
        if not self.train:
            out.append("prepare.train must name the train file (or hub split); got ''")
        for key, most in (("text_column", 2), ("label_column", 64)):
            value = getattr(self, key)
            listed = value if isinstance(value, list) else [value]
            if isinstance(value, list) and not 1 <= len(value) <= most:
                out.append(f"prepare.{key} lists {len(value)} columns; give 1 to {most}"
                           + (" (two = a sentence pair)" if key == "text_column" else ""))
            for one in listed:
                if isinstance(one, bool) or not isinstance(one, (str, int)):
                    out.append(f"prepare.{key} must be a column name or a 0-based column "
                               f"position (or a list of them); got {one!r}")
                elif isinstance(one, int) and one < 0:
                    out.append(f"prepare.{key} must be a 0-based column position (>= 0); got {one}")
                elif one == "":
                    out.append(f"prepare.{key} must name a column; got ''")
        shared = {str(c) for c in self.text_columns()} & {str(c) for c in self.label_columns()}
        if shared:
            out.append(f"prepare.text_column and prepare.label_column must be different columns; "
                       f"both name {sorted(shared)[0]!r}")
        if len(self.label_columns()) > 1 and self.task not in ("auto", "regression"):
            out.append(f"prepare.label_column lists several columns, which only a regression "
                       f"(several targets) can use; got task {self.task}")
        if not isinstance(self.missing_labels, list) or not all(
                entry is None or (isinstance(entry, (str, int, float))
                                  and not isinstance(entry, bool))
                for entry in self.missing_labels):
            out.append(f"prepare.missing_labels must be a list of label spellings, e.g. "
                       f'["", "NaN", "null", "None", "-"] (quote words YAML reads as true or '
                       f'false, like "no"); got {self.missing_labels!r}')
        if len(self.label_delimiter) != 1 or self.label_delimiter.isspace():
            out.append(f"prepare.label_delimiter must be one visible character; got "
                       f"{self.label_delimiter!r}")
        return out

    def text_columns(self) -> list:
        """The text column(s): one, or two for a sentence pair."""
        return list(self.text_column) if isinstance(self.text_column, list) else [self.text_column]

    def label_columns(self) -> list:
        """The label column(s): one, or several regression targets."""
        return (list(self.label_column) if isinstance(self.label_column, list)
                else [self.label_column])


@dataclass(frozen=True)
class TokenizeConfig:
    """`tokenize`: the one-off tokenizer pass into memory-mapped Arrow."""

    max_length: int = 128
    """Truncate rows to this many tokens (special tokens included); truncations are counted."""
    batch_rows: int = 8192
    """Rows per tokenizer call; bounds the stage's memory, not its output."""

    def problems(self) -> list[str]:
        out = []
        if not 8 <= self.max_length <= 65536:
            out.append(f"tokenize.max_length must be in [8, 65536]; got {self.max_length}")
        if self.batch_rows < 1:
            out.append(f"tokenize.batch_rows must be >= 1; got {self.batch_rows}")
        return out


