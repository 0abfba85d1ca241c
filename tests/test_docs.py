"""The docs site: it builds strictly, its params reference is generated from the config
dataclasses (so a field without a docstring fails here), every page is in the navigation, and
the README stays a short front door whose links all land."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from wellfed.config import SECTIONS

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT / "docs" / "hooks"))
import params as params_hook  # noqa: E402  (docs/hooks/params.py)


def test_every_config_field_has_a_docstring():
    assert len(SECTIONS) == 9
    missing = [f"{name}.{field.name}" for name, cls in SECTIONS.items()
               for field in dataclasses.fields(cls)
               if not params_hook.field_docs(cls).get(field.name)]
    assert not missing, f"config fields without a docstring: {missing}"


def test_the_params_page_lists_every_key_with_its_default():
    page = params_hook.tables()
    keys = re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \| (.+?) \|", page, re.M)
    expected = [f"{n}.{f.name}" for n, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
    assert [k for k, _ in keys] == expected
    assert dict(keys)["train.cuda_graphs"] == "`auto`" and "(undocumented)" not in page


def nav_pages(nav) -> list[str]:
    out = []
    for entry in nav:
        for value in entry.values():
            out += nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_every_docs_page_is_in_the_navigation():
    config = yaml.safe_load((PROJECT / "mkdocs.yml").read_text())
    pages = sorted(str(p.relative_to(PROJECT / "docs")) for p in (PROJECT / "docs").rglob("*.md"))
    assert len(pages) >= 15
    assert sorted(nav_pages(config["nav"])) == pages


def test_the_readme_is_a_short_front_door_whose_links_land():
    text = (PROJECT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", text)
    assert len(links) >= 15
    assert [link for link in links if not (PROJECT / link).is_file()] == []


def test_mkdocs_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs tools are dev dependencies: make install")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d",
                           str(tmp_path / "site")], cwd=PROJECT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    params = (tmp_path / "site" / "reference" / "params" / "index.html").read_text()
    assert "train.cuda_graphs" in params and "prepare.missing_labels" in params
    home = (tmp_path / "site" / "index.html").read_text()  # the README's tour, its links the site's
    assert 'id="a-five-minute-tour"' in home and "wellfed-compare" in home
    assert 'href="sweeps/"' in home and 'href="docs/' not in home
    assert (tmp_path / "site" / "stylesheets" / "extra.css").is_file()  # long lines wrap or scroll
    pages, glued = run_on_lists(tmp_path / "site")
    assert pages >= 15 and not glued, f"lists rendered as paragraphs: {glued}"


def run_on_lists(site: Path) -> tuple[int, list[str]]:
    """(pages read, "page: line" of each list item the site shows inside a paragraph): Markdown
    starts no list inside a paragraph, so `text:` then `- item` on the next line, without a
    blank line between, renders as one run-on paragraph with the dashes in it."""
    import html

    pages, glued = 0, []
    for page in sorted(site.rglob("index.html")):
        pages += 1
        for paragraph in re.findall(r"<p>(.*?)</p>", page.read_text(encoding="utf-8"), re.S):
            lines = html.unescape(re.sub(r"<[^>]+>", "", paragraph)).splitlines()
            glued += [f"{page.parent.relative_to(site)}: {line.strip()[:60]}"
                      for line in lines[1:] if re.match(r"\s*(?:[-*+]|\d+\.)\s+\S", line)]
    return pages, glued


def test_the_readmes_runs_table_is_the_narrow_one_docs_compare_gives():
    """After the README's own tour (a queued sweep), DVC adds State and Executor columns and the
    sweep's name: the README's `dvc exp show` drops them as docs/compare.md's narrow one does
    (123 characters on the tests' project there, 159 without)."""
    def shows(page: str) -> list[str]:
        text = (PROJECT / page).read_text(encoding="utf-8")
        return [line.split("  #")[0].strip() for line in text.splitlines()
                if line.startswith("dvc exp show --only-changed --drop")]

    narrow = [line for line in shows("docs/compare.md") if "State|Executor" in line]
    assert len(narrow) == 1 and shows("README.md") == narrow


def documented_outputs() -> set[str]:
    """Files the docs' commands write where they run (the project root): `--out FILE`,
    `wellfed-predict MODEL INPUT OUTPUT`, and `dvc plots show/diff`'s `dvc_plots/`. Absolute
    paths and data/ (DVC's outputs, ignored where DVC writes them) are left out."""
    found = set()
    pages = [PROJECT / "README.md", *sorted((PROJECT / "docs").rglob("*.md"))]
    for page in pages:
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", page.read_text(encoding="utf-8"),
                                re.M | re.S):
            for line in block.splitlines():
                command = line.split(" #")[0].removeprefix("$ ")
                found.update(re.findall(r"--out (\S+)", command))
                predict = re.search(r"wellfed-predict (\S+) (\S+) (\S+)", command)
                if predict:
                    found.add(predict.group(3))
                if re.search(r"\bdvc plots (show|diff)\b", command):
                    found.add("dvc_plots/")
    return {p for p in found if not p.startswith(("/", "data/", "<", "$"))}


def test_what_the_documented_commands_write_is_gitignored():
    outputs = documented_outputs()
    assert {"compare.json", "seeds.json", "out.parquet", "dvc_plots/"} <= outputs, outputs
    proc = subprocess.run(["git", "check-ignore", "--no-index", "-v", *sorted(outputs)],
                          cwd=PROJECT, capture_output=True, text=True)
    ignored = {line.split("\t")[-1] for line in proc.stdout.splitlines()}
    assert ignored == outputs, f"not in .gitignore: {sorted(outputs - ignored)}"


def test_the_versions_list_cut_is_said_alike_in_the_code_and_the_docs():
    """MLflow's versions list shows a description's first words (a user saw `Not champion
    (@cham...`, 19 characters): docs/mlflow.md and version_description's docstring give the same
    cut, and the figure that tells versions apart is inside it."""
    from wellfed.track import version_description

    docs = (PROJECT / "docs" / "mlflow.md").read_text(encoding="utf-8")
    cut = re.search(r"cut to its first words\s+\(`([^`]+)`\)", docs).group(1)
    assert cut == "macro_f1 0.9500 · lr 1..."
    assert f"`{cut}`" in " ".join(version_description.__doc__.split())
    said = version_description.describe("@champion: eval/macro_f1 0.9500 on the test split",
                                        "champion", "eval/macro_f1", 0.95, "lr 1e-4 bs 32")
    assert said[:19] == "macro_f1 0.9500 · l"
