"""Sphinx configuration of the dpadmm documentation site.

Sphinx with MyST Markdown, as Flower's own documentation: the pages stay Markdown files that read well on
GitHub, autodoc renders the API from the docstrings, and the configuration keys come from the
configuration classes (``_ext/dpadmm_docs.py``). Build, from the project root:

    sphinx-build -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the project's packages (server, clients, strategies) as the app has them
sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "dpadmm"
author = "the dpadmm developers"
copyright = "2026, the dpadmm developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxcontrib.katex",
    "sphinx.ext.viewcode",
    "dpadmm_docs",
]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 4  # `[text](page.md#a-heading)` links are checked like every internal link
suppress_warnings: list[str] = []
nitpicky = False  # autodoc's type hints name torch and Flower classes this site does not document

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "results/cnn-femnist/engine-*", "results/cnn-femnist/flower-*"]

html_theme = "furo"
html_title = "dpadmm"
html_static_path = ["_static"]

# The equations render offline: sphinxcontrib-katex copies KaTeX's script (katex.min.js, its auto-render
# and its own stylesheet) into _static, and _static/katex/ holds KaTeX's stylesheet and fonts of the same
# release (katex.min.css and fonts/ of the npm package katex at sphinxcontrib.katex.katex_version, MIT
# licence in _static/katex/LICENSE), in place of the extension's default CDN link. No page loads a
# script, stylesheet or font from the network; the build checks it (_ext/dpadmm_docs.py, check_offline).
katex_css_path = "katex/katex.min.css"
katex_prerender = False  # rendered in the browser by the shipped katex.min.js: no Node.js at build time

# Flower's docstrings (the Strategy methods the strategies override inherit them) are NumPy style.
napoleon_numpy_docstring = True
napoleon_google_docstring = False

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
