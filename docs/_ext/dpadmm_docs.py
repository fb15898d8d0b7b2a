"""Sphinx directive ``dpadmm-keys``: a family's configuration keys, generated from its configuration class.

Every family's configuration is a frozen dataclass whose fields carry their help text (``metadata["help"]``);
the same fields make the ``dpadmm`` command's flags and the Flower app's run config
(:mod:`dpadmm.keys`). Rendering the table from them keeps the documentation equal to what the code
accepts, with nothing copied by hand. In MyST Markdown::

    ```{dpadmm-keys} dpadmm.iadmm.config.RunConfig
    :prefix:
    :papers:
    ```

``:prefix: linadmm.`` writes the keys as the Flower run config names another family's keys;
``:papers:`` adds the column of the values the papers preset (``PAPERS``) sets.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from offline_check import problems as offline_problems
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from dpadmm.keys import key


def _literal(value: Any) -> nodes.Node:
    """A value as a run config writes it (TOML): strings quoted, booleans lower-case."""
    if isinstance(value, bool):
        return nodes.literal(text=str(value).lower())
    return nodes.literal(text=repr(value) if isinstance(value, str) else str(value))


def _default(field: dataclasses.Field) -> Any:
    """The field's declared default (not the value ``__post_init__`` may resolve it to)."""
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()  # type: ignore[misc]


def _row(cells: list[nodes.Node | str]) -> nodes.row:
    row = nodes.row()
    for cell in cells:
        entry = nodes.entry()
        entry += nodes.paragraph("", "", cell if isinstance(cell, nodes.Node) else nodes.Text(cell))
        row += entry
    return row


def _help(field: dataclasses.Field, where: str) -> str:
    text = field.metadata.get("help", "")
    if not text:
        raise ValueError(f"{where}: field {field.name!r} has no help text (metadata['help'])")
    return str(text)


class KeysDirective(SphinxDirective):
    """The table of a configuration class's keys: key, default, (papers preset,) meaning."""

    required_arguments = 1
    option_spec = {"prefix": directives.unchanged, "papers": directives.flag}

    def run(self) -> list[nodes.Node]:
        module_name, _, class_name = self.arguments[0].rpartition(".")
        cls = getattr(importlib.import_module(module_name), class_name)
        prefix = self.options.get("prefix", "") or ""
        preset: dict[str, Any] | None = None
        if "papers" in self.options:
            preset = importlib.import_module(module_name).PAPERS
        header = ["key", "default", *(["papers"] if preset is not None else []), "meaning"]
        table = nodes.table(classes=["dpadmm-keys"])
        group = nodes.tgroup(cols=len(header))
        table += group
        for width in ([22, 14, 12, 52] if preset is not None else [24, 16, 60]):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        head += _row(header)
        group += head
        body = nodes.tbody()
        for field in dataclasses.fields(cls):
            name = key(field.name)
            if prefix and name == "algorithm":  # the app's top-level key picks the family
                shown = nodes.literal(text=name)
            else:
                shown = nodes.literal(text=f"{prefix}{name}")
            cells: list[nodes.Node | str] = [shown, _literal(_default(field))]
            if preset is not None:
                cells.append(_literal(preset[field.name]) if field.name in preset else "")
            cells.append(_help(field, self.arguments[0]))
            body += _row(cells)
        group += body
        return [table]


logger = logging.getLogger(__name__)

_LITERAL = re.compile(r"(``.*?``)")


def escape_bars(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """The docstrings write norms and absolute values in ASCII (``||x||_1``, ``|N_i|``); reStructuredText
    would read ``|x|`` as a substitution, so every bar outside an inline literal is escaped (this project's
    docstrings use no substitutions)."""
    for i, line in enumerate(lines):
        parts = _LITERAL.split(line)
        lines[i] = "".join(part if part.startswith("``") else part.replace("|", "\\|") for part in parts)


def check_offline(app: Sphinx, exception: Exception | None) -> None:
    """After an HTML build: a warning (an error under ``-W``) for each thing that would not work offline:
    a script, stylesheet or font from the network, a font the math stylesheet names but the build lacks,
    an equation not wrapped for KaTeX's auto-render (``offline_check.py``)."""
    if exception is None and app.builder.format == "html":
        for problem in offline_problems(Path(app.outdir)):
            logger.warning("offline: %s", problem)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("dpadmm-keys", KeysDirective)
    app.connect("autodoc-process-docstring", escape_bars)
    app.connect("build-finished", check_offline)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
