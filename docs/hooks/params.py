"""MkDocs hook: the params reference page, written at build time from the config dataclasses.

Each params.yaml section is a frozen dataclass in `wellfed.config` with a docstring under every
field; this hook reads them (ast over the class source, so the text is the code's own) and
replaces the `<!-- params -->` marker of docs/reference/params.md with one table per section.
The page therefore cannot drift from the code, and tests/test_docs.py fails when a field has no
docstring.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

MARKER = "<!-- params -->"


def field_docs(cls) -> dict[str, str]:
    """{field name: the docstring written under it} for a dataclass (fields without one are
    left out, which the docs test reports)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def default_of(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "(required)"
    import yaml

    return f"`{yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix(chr(10) + '...')}`"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def tables() -> str:
    from wellfed.config import SECTIONS

    out = []
    for name, cls in SECTIONS.items():
        docs = field_docs(cls)
        summary = inspect.cleandoc(cls.__doc__ or "")
        out += [f"## `{name}`", "", summary, "", "| key | default | what it does |",
                "|---|---|---|"]
        for field in dataclasses.fields(cls):
            out.append(f"| `{name}.{field.name}` | {cell(default_of(field))} | "
                       f"{cell(docs.get(field.name, '(undocumented)'))} |")
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, tables())
    return markdown
