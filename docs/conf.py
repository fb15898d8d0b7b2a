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
    "sphinx.ext.mathjax",
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
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
