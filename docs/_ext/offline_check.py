"""The built site reads offline: what :func:`problems` checks on a Sphinx HTML output folder.

Plain Python (no Sphinx): the docs build runs it when it finishes (``dpadmm_docs.check_offline``, a
warning each, so ``-W`` fails), and ``tests/test_docs.py`` runs it on a build of its own.

- no page loads a script or a stylesheet from the network (``https://``, ``http://`` or
  ``//host``), and no stylesheet in ``_static`` takes a font, image or import from the network;
- every ``url(...)`` of a stylesheet in ``_static`` (KaTeX's fonts) is a file of the build;
- every page with math loads KaTeX's script, its auto-render and KaTeX's stylesheet from ``_static``,
  and every equation's source is wrapped in the delimiters that auto-render reads (``\\(...\\)`` inline,
  ``\\[...\\]`` displayed), so the browser renders it instead of showing the TeX.
"""

from __future__ import annotations

import re
from pathlib import Path

REMOTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.I)  # https://..., http://..., //host/...
SCRIPT_SRC = re.compile(r"<script\b[^>]*\bsrc=[\"']([^\"']+)[\"']", re.I)
LINK_HREF = re.compile(r"<link\b[^>]*\bhref=[\"']([^\"']+)[\"'][^>]*>", re.I)
CSS_URL = re.compile(r"url\(\s*[\"']?([^\"')]+?)[\"']?\s*\)", re.I)
CSS_IMPORT = re.compile(r"@import\s+[\"']([^\"']+)[\"']", re.I)
MATH_CLASS = r"class=\"(?:[^\"]*\s)?math(?:\s[^\"]*)?\""  # the class "math", not "math-wrapper"
INLINE_MATH = re.compile(rf"<span {MATH_CLASS}[^>]*>(.*?)</span>", re.S)
DISPLAY_MATH = re.compile(rf"<div {MATH_CLASS}[^>]*>(.*?)</div>", re.S)
KATEX_FILES = ("_static/katex.min.js", "_static/auto-render.min.js", "_static/katex/katex.min.css")


def _loads(html: str) -> list[str]:
    """The scripts and stylesheets (and preloaded fonts) that a page loads, in its <head> or at the end of
    its <body> (where Furo puts the scripts)."""
    found = SCRIPT_SRC.findall(html)
    for tag in re.findall(r"<link\b[^>]*>", html, re.I):
        rel = re.search(r"\brel=[\"']([^\"']+)[\"']", tag, re.I)
        href = LINK_HREF.search(tag)
        if href and rel and {"stylesheet", "preload", "modulepreload"} & set(rel.group(1).lower().split()):
            found.append(href.group(1))
    return found


def problems(outdir: Path) -> list[str]:
    """Every reason the HTML site in ``outdir`` would not render its equations, or would load anything,
    without a network; empty when it reads offline."""
    outdir = Path(outdir)
    found: list[str] = []
    static = outdir / "_static"
    for css in sorted(static.rglob("*.css")):
        text = css.read_text(encoding="utf-8", errors="replace")
        for target in CSS_URL.findall(text) + CSS_IMPORT.findall(text):
            if target.startswith(("data:", "#")):
                continue
            where = css.relative_to(outdir)
            if REMOTE.match(target):
                found.append(f"{where} loads {target} from the network")
            elif not (css.parent / target.split("?")[0].split("#")[0]).is_file():
                found.append(f"{where} needs {target}, which the build does not have")
    pages = sorted(outdir.rglob("*.html"))
    if not pages:
        found.append(f"no HTML page in {outdir}")
    for page in pages:
        html = page.read_text(encoding="utf-8", errors="replace")
        name = page.relative_to(outdir)
        loads = _loads(html)
        for target in loads:
            if REMOTE.match(target):
                found.append(f"{name} loads {target} from the network")
        inline, display = INLINE_MATH.findall(html), DISPLAY_MATH.findall(html)
        if not inline and not display:
            continue
        resolved = {(page.parent / target.split("?")[0]).resolve() for target in loads}
        for needed in KATEX_FILES:
            if (outdir / needed).resolve() not in resolved:
                found.append(f"{name} has math but does not load {needed}")
            elif not (outdir / needed).is_file():
                found.append(f"{name} loads {needed}, which the build does not have")
        for source in inline:
            if not (source.startswith("\\(") and source.endswith("\\)")):
                found.append(f"{name}: inline math not wrapped in \\( \\): {source[:80]!r}")
        for source in display:
            body = re.sub(r"<span class=\"eqno\">.*?</span>\s*</span>|<span class=\"eqno\">.*?</span>", "",
                          source, flags=re.S).strip()
            if not (body.startswith("\\[") and body.endswith("\\]")):
                found.append(f"{name}: displayed math not wrapped in \\[ \\]: {body[:80]!r}")
            if "<" in body:
                found.append(f"{name}: displayed math holds a raw '<' (write \\lt): {body[:80]!r}")
    return found
