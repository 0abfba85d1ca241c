"""Make `dvc plots show` and `dvc plots diff` draw without the internet.

DVC's page loads Vega, Vega-Lite and Vega-Embed from a CDN (cdn.jsdelivr.net), so offline it
is blank. This writes DVC's HTML template with the three libraries inline, from the
vl-convert-python package (its wheel carries them: nothing is downloaded), to
.dvc/tmp/plots.html, and makes it this clone's template: `dvc config --local
plots.html_template tmp/plots.html` (.dvc/config.local, which git never sees). `make install`
runs it; without it DVC's own page is used, which needs the internet.

usage: python scripts/plots_page.py [PROJECT_DIR]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PAGE = """<!DOCTYPE html>
<html>
<head>
    <meta charset="utf-8">
    <title>DVC Plot</title>
    <!-- Vega {vega}, Vega-Lite {vega_lite}, Vega-Embed {embed}: vl-convert-python {package}'s
         bundle, inline, so the page draws offline (scripts/plots_page.py) -->
    <script>
{bundle}
    </script>
    <style>
        table {{
            border-spacing: 15px;
        }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""
"""DVC's page (dvc_render.html.PAGE_HTML) with the libraries inline in place of `{scripts}`,
DVC's CDN <script> tags; `{plot_divs}` is where DVC puts each plot (it calls vegaEmbed)."""

RELATIVE = "tmp/plots.html"
"""Where the page goes, relative to .dvc/ (how DVC reads plots.html_template)."""


def newest_vega_lite_5(versions: list[str]) -> str:
    """DVC's plot templates are Vega-Lite 5 specs ($schema .../vega-lite/v5.json)."""
    fives = [v for v in versions if v.split(".")[0] == "5"]
    if not fives:
        raise SystemExit(f"error: vl-convert-python offers no Vega-Lite 5 (it has "
                         f"{', '.join(versions)}); install a version that does: "
                         "pip install 'vl-convert-python>=1.3,<2'")
    return max(fives, key=lambda v: tuple(int(p) for p in v.split(".")))


def page() -> str:
    from importlib.metadata import version

    import vl_convert

    vega_lite = newest_vega_lite_5(vl_convert.get_vegalite_versions())
    bundle = vl_convert.javascript_bundle(vl_version=vega_lite)
    if "</script" in bundle.lower():  # would end the inline <script> early
        bundle = bundle.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")
    return PAGE.format(vega=vl_convert.get_vega_version(), vega_lite=vega_lite,
                       embed=vl_convert.get_vega_embed_version(),
                       package=version("vl-convert-python"), bundle=bundle)


def main(project: Path) -> None:
    dvc_dir = project / ".dvc"
    if not dvc_dir.is_dir():
        raise SystemExit(f"error: {project} has no .dvc folder: run this in the project")
    target = dvc_dir / RELATIVE
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(target.name + ".tmp")
    staging.write_text(page(), encoding="utf-8")
    staging.replace(target)
    dvc = Path(sys.executable).with_name("dvc")
    subprocess.run([str(dvc) if dvc.exists() else "dvc", "config", "--local",
                    "plots.html_template", RELATIVE], cwd=project, check=True)
    print(f"[wellfed] dvc plots show/diff draw offline: {target.relative_to(project)} "
          f"({target.stat().st_size / 1e6:.1f} MB, the Vega libraries inline), set in "
          ".dvc/config.local")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve())
