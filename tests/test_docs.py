"""The documentation (README.md and the site in docs/): every command in it runs as written.

Every line of a ``bash`` block, split at ``&&``, is one command, and each kind has its check:

- ``dpadmm privacy ...`` and the ``dpadmm train ...`` of ``CHEAP_PAGES`` run (seconds each), and
  ``dpadmm audit ...`` with :data:`AUDIT_TRIALS` trials instead of the page's;
- any other ``dpadmm train ...`` (long runs, a GPU) goes through the command's parser and its
  configuration's checks, and a private one runs as ``dpadmm privacy`` with the same flags (the guarantee
  computed, the data files found); only the training is skipped;
- ``dpadmm reproduce|deploy ...`` and ``python -m benchmarks.<name> ...`` go through their own argument
  parsers (an unknown or malformed flag fails);
- ``flwr run <app> ...``: the app exists, Flower fuses its ``--run-config`` with the app's pyproject.toml
  (an unknown key fails, as in Flower), and the ServerApp's own configuration checks accept the result
  (or refuse it, for a line the page marks ``# fails: <why>``);
- ``pip install ...``: the extras named exist; ``pytest ...``: the test files named exist;
- the commands of other tools (Ray, Flower's SuperNode registration, Sphinx, venv and shell set-up) are
  listed in ``EXTERNAL``.

A command of no known kind fails, so a new kind of command gets its check before it is documented.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import re
import shlex
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from flwr.common.config import get_fused_config_from_dir, parse_config_args

from dpadmm import cli
from dpadmm.families import FAMILIES, Family
from server import server_app
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]
# Programs of other tools: checked by their own projects, not here.
EXTERNAL = {"ray", "sphinx-build", "python3.11", "."}
EXTERNAL_FLWR = {"supernode"}  # flwr subcommands other than `run`
EXTERNAL_MODULES = {"venv", "webbrowser"}  # python -m <module>
# Pages whose `dpadmm train` commands run (seconds each); the others' are long runs or need a GPU.
CHEAP_PAGES = {"README.md", "docs/testing.md"}
AUDIT_TRIALS = 2000  # releases per neighbour of a documented `dpadmm audit` (flags checked, attack run)
ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")


@dataclass(frozen=True)
class Command:
    page: str
    argv: tuple[str, ...]
    fails: bool = False  # the page shows it failing: its line ends with the comment `# fails: <why>`

    def __str__(self) -> str:
        return f"{self.page}: {shlex.join(self.argv)}"


def commands() -> Iterator[Command]:
    """Every command of every page's bash blocks; ``NAME=value`` lines set variables for the lines after."""
    for page in PAGES:
        variables: dict[str, str] = {}
        text = page.read_text()
        for block in re.findall(r"```bash\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                fails = "# fails:" in line
                words = shlex.split(line, comments=True)
                if len(words) == 1 and ENV.match(words[0]):
                    name, value = words[0].split("=", 1)
                    variables[name] = value
                    continue
                words = [_expand(w, variables) for w in words]
                while words:
                    cut = words.index("&&") if "&&" in words else len(words)
                    argv = words[:cut]
                    while argv and ENV.match(argv[0]):  # a leading VARIABLE=value sets the environment
                        argv = argv[1:]
                    if argv:
                        yield Command(str(page.relative_to(ROOT)), tuple(argv), fails)
                    words = words[cut + 1:]


def _expand(word: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), word)


ALL = list(commands())
# The pages name the shared data relative to the project root, or by an example absolute path; the
# commands run in a temporary folder (their outputs land there), so both become the absolute path.
SHARED = str(ROOT.parent / "shared" / "data")
PLACEHOLDERS = {"../shared/data": SHARED, "/abs/path/shared/data": SHARED}


def _here(argv: tuple[str, ...]) -> list[str]:
    out = []
    for word in argv:
        for old, new in PLACEHOLDERS.items():
            word = word.replace(old, new)
        out.append(word)
    return out


def _dpadmm(argv: list[str], command: Command, where: Path) -> None:
    family = cli._family_in(argv)
    args = cli.build_parser(family, cli._paper_in(argv)).parse_args(argv)  # SystemExit on a bad flag
    if args.command in ("reproduce", "deploy"):
        return
    config = cli._config_from(args, family)  # every key's check
    if args.command == "train" and command.page not in CHEAP_PAGES:
        if not config.private:
            return  # a long non-private run: nothing more to check without training
        argv = _without_value(["privacy", *[w for w in argv[1:] if w != "--no-progress"]], "--out")
    expected = "privacy"
    if args.command == "audit":  # the documented trial counts take minutes: the same flags, a few thousand
        argv, expected = [*_without_value(argv, "--trials"), "--trials", str(AUDIT_TRIALS)], "bound"
    # `dpadmm` is cli.main: run here, in a folder of its own (its outputs land there)
    with contextlib.chdir(where), contextlib.redirect_stdout(io.StringIO()) as out:
        status = cli.main(argv)
    assert status == 0, f"{command}\n{out.getvalue()[-2000:]}"
    assert expected in out.getvalue(), f"{command}: no {expected} in\n{out.getvalue()[-2000:]}"


def _without_value(argv: list[str], flag: str) -> list[str]:
    if flag not in argv:
        return argv
    i = argv.index(flag)
    return argv[:i] + argv[i + 2:]


def _flwr(argv: list[str], command: Command, monkeypatch: pytest.MonkeyPatch) -> None:
    if argv[0] in EXTERNAL_FLWR:
        return
    assert argv[0] == "run", f"{command}: unknown flwr command {argv[0]!r}"
    parser = argparse.ArgumentParser(prog="flwr run", exit_on_error=False)
    parser.add_argument("app")
    parser.add_argument("superlink", nargs="?")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--run-config", action="append")
    parser.add_argument("--federation-config")
    args = parser.parse_args(argv[1:])
    app = ROOT / args.app
    assert (app / "pyproject.toml").exists(), f"{command}: no Flower app at {app}"
    if args.federation_config:
        assert "num-supernodes=" in args.federation_config or args.superlink, command
    fused = get_fused_config_from_dir(app, parse_config_args(args.run_config))  # Flower's own fusion
    if app == ROOT and command.fails:
        with pytest.raises(ValueError, match="is not allowed"):
            server_app.configured(fused)
    elif app == ROOT:
        server_app.configured(fused)
    else:  # the example app: its own split of the run config
        monkeypatch.syspath_prepend(str(app))
        importlib.import_module(f"{app.name}.settings").settings(fused)


def _python(argv: list[str], command: Command, monkeypatch: pytest.MonkeyPatch) -> None:
    assert argv[0] == "-m", f"{command}: only `python -m <module>` is documented"
    name = argv[1]
    if name in EXTERNAL_MODULES:
        return
    assert name.startswith("benchmarks."), f"{command}: unknown module {name}"
    module = importlib.import_module(name)

    class Parsed(Exception):
        pass

    original = argparse.ArgumentParser.parse_args

    def parse_only(self: argparse.ArgumentParser, args: list[str] | None = None, namespace: object = None):
        original(self, args, namespace)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    monkeypatch.setattr(sys, "argv", [name, *argv[2:]])
    with pytest.raises(Parsed):
        module.main()


def _pip(argv: list[str], command: Command) -> None:
    assert argv[0] == "install", command
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for spec in argv[1:]:
        for group in re.findall(r"\[([\w,]+)\]", spec):
            unknown = set(group.split(",")) - set(extras)
            assert not unknown, f"{command}: no extra {unknown} in pyproject.toml"
        if spec.startswith("torch=="):
            assert spec == "torch==2.13.0", command


def _pytest(argv: list[str], command: Command) -> None:
    for word in argv:
        if word.startswith("tests/"):
            assert (ROOT / word.split("::")[0]).exists(), f"{command}: no {word}"


def test_the_pages_have_commands() -> None:
    pages = {c.page for c in ALL}
    assert "README.md" in pages and "docs/getting-started.md" in pages
    assert len(ALL) > 50


@pytest.mark.parametrize("command", ALL, ids=str)
def test_every_documented_command_runs_as_written(command: Command, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    program, *argv = _here(command.argv)
    assert not command.fails or program == "flwr", f"{command}: only a failing `flwr run` is checked"
    if program in EXTERNAL:
        return
    if program == "dpadmm":
        _dpadmm(argv, command, tmp_path)
    elif program == "flwr":
        _flwr(argv, command, monkeypatch)
    elif program == "python":
        _python(argv, command, monkeypatch)
    elif program == "pip":
        _pip(argv, command)
    elif program == "pytest":
        _pytest(argv, command)
    else:
        pytest.fail(f"{command}: no check for the program {program!r}; add one to tests/test_docs.py")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_familys_page_lists_its_keys_from_the_code(family: Family) -> None:
    """The site's key tables are the ``dpadmm-keys`` directive over the family's configuration class
    (docs/_ext/dpadmm_docs.py), which needs a help text for every key."""
    page = (ROOT / "docs" / "families" / f"{family.name}.md").read_text()
    assert f"```{{dpadmm-keys}} {family.config.__module__}.{family.config.__name__}" in page
    for field in dataclasses.fields(family.config):
        assert field.metadata.get("help"), f"{family.config.__name__}.{field.name} has no help text"


def test_the_equations_cite_functions_the_api_reference_documents() -> None:
    """Each ``{py:func}`` of a family page names a function that exists, in a module the API reference
    documents (so the link resolves), and stands outside the math (MathJax would print it as text)."""
    documented = set(re.findall(r"automodule:: (\S+)", (ROOT / "docs" / "reference" / "api.md").read_text()))
    for page in sorted((ROOT / "docs" / "families").glob("*.md")):
        text = page.read_text()
        cited = set(re.findall(r"\{py:func\}`([^`]+)`", text))
        assert len(cited) >= 5, f"{page.name} cites {len(cited)} functions"
        for target in cited:
            module, _, name = target.rpartition(".")
            assert module in documented, f"{page.name}: {module} is not in docs/reference/api.md"
            assert callable(getattr(importlib.import_module(module), name, None)), f"{page.name}: {target}"
        for math in re.findall(r"\$\$(.*?)\$\$", text, re.S):
            assert "{py:" not in math, f"{page.name}: a role inside display math: {math.strip()[:80]}"
