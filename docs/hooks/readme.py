"""MkDocs hook: the site's home page shows the README's five-minute tour, taken from README.md at
build time, so the front door and the home page cannot drift apart.

A `<!-- readme: <title> -->` marker in a page is replaced by the README's `## <title>` section
(its heading and text up to the next `## `), with links into `docs/` made relative to the
site's pages. A title the README lacks fails the build with one line naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

MARKER = re.compile(r"<!-- readme: (.+?) -->")


def section(readme: str, title: str) -> str:
    """The `## title` section of `readme`, heading included, up to the next `## ` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
    if match is None:
        raise ValueError(f"docs: README.md has no '## {title}' section for the home page; "
                         "rename the marker in docs/index.md or the README's heading")
    return f"## {title}\n{match.group(1)}".rstrip() + "\n"


def site_links(markdown: str) -> str:
    """README links `](docs/page.md#part)` as the docs see them: `](page.md#part)`."""
    return re.sub(r"\]\(docs/", "](", markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if not MARKER.search(markdown):
        return markdown
    readme = (Path(config["config_file_path"]).parent / "README.md").read_text(encoding="utf-8")
    return MARKER.sub(lambda m: site_links(section(readme, m.group(1))), markdown)
