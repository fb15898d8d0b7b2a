"""The documentation (README.md and the site in docs/): every command in it runs as written.

Every line of a ``bash`` block, split at ``&&``, is one command, and each kind has its check:

- ``dpadmm privacy ...`` and the ``dpadmm train ...`` of ``CHEAP_PAGES`` run (seconds each), and
  ``dpadmm audit ...`` with :data:`AUDIT_TRIALS` trials instead of the page's;
- any other ``dpadmm train ...`` (long runs, a GPU) goes through the command's parser and its
  configuration's checks, and a private one runs as ``dpadmm privacy`` with the same flags (the guarantee
  computed, the data files found); only the training is skipped;
- ``dpadmm reproduce|deploy ...`` and ``python -m benchmarks.<name> ...`` go through their own argument
  parsers (an unknown or malformed flag fails); ``dpadmm data fetch ...`` runs;
- ``flwr run <app> ...``: the app exists, Flower fuses its ``--run-config`` with the app's pyproject.toml
  (an unknown key fails, as in Flower), and the ServerApp's own configuration checks accept the result
  (or refuse it, for a line the page marks ``# fails: <why>``);
- ``pip install ...``: the extras named exist; ``pytest ...``: the test files named exist;
- the commands of other tools (Ray, Flower's SuperNode registration, Sphinx, venv and shell set-up) are
  listed in ``EXTERNAL``.

A command of no known kind fails, so a new kind of command gets its check before it is documented.

The figures the pages state for their cheap commands (the main job's in the README and getting-started, the
family pages' and testing.md's) are compared with what the commands print, so that a change of defaults
fails until the pages say what the code does.

The commands run as on a fresh clone: the data sets come from an empty cache (``DPADMM_CACHE``, a folder
of the session's), fetched on first use from a ``file://`` mirror of ../shared/data
(``DPADMM_DATA_MIRRORS``), and the README's and the family pages' commands never name ../shared.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from flwr.common.config import get_fused_config_from_dir, parse_config_args

from dpadmm import cli
from dpadmm.data import download
from dpadmm.data.sources import SOURCES
from dpadmm.families import FAMILIES, Family
from dpadmm.iadmm.config import RunConfig
from dpadmm.runs.results import read_metrics
from server import server_app
from tests.conftest import ROOT, SHARED_DATA, missing_data

PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]
# Programs of other tools: checked by their own projects, not here.
EXTERNAL = {"ray", "sphinx-build", "python3.11", "."}
EXTERNAL_FLWR = {"supernode"}  # flwr subcommands other than `run`
EXTERNAL_MODULES = {"venv"}  # python -m <module>
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
PLACEHOLDERS = ("../shared/data", "/abs/path/shared/data")
# A clone without ../shared (a new user's): the commands' data come from the public sources into the cache,
# and a command whose data cannot be fetched here is skipped with the command that gets it.
HAS_SHARED = Path(SHARED).is_dir()


def _here(argv: tuple[str, ...]) -> list[str]:
    """The command with the pages' data folder made a real one: ../shared/data, or the cache laid out
    the same way where there is no ../shared."""
    root = SHARED if HAS_SHARED else str(download.cache_dir())
    out = []
    for word in argv:
        for old in PLACEHOLDERS:
            word = word.replace(old, root)
        out.append(word)
    return out


# What `dpadmm` prints when a command's data set is neither there nor downloadable (DownloadError, or a
# data-dir naming ../shared/data on a clone without it).
NO_DATA = ("could not download", "cannot be downloaded", "does not exist", "not found")


def _dpadmm(argv: list[str], command: Command, where: Path) -> None:
    family = cli._family_in(argv)
    args = cli.build_parser(family, cli._paper_in(argv)).parse_args(argv)  # SystemExit on a bad flag
    if args.command in ("reproduce", "deploy"):
        return
    if args.command == "data":
        with contextlib.redirect_stdout(io.StringIO()) as out, \
                contextlib.redirect_stderr(io.StringIO()) as err:
            status = cli.main([*argv, "--no-progress"])
        _skip_for_data(status, err.getvalue(), command)
        assert status == 0 and "licence:" in out.getvalue(), f"{command}\n{out.getvalue()[-2000:]}"
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
    with contextlib.chdir(where), contextlib.redirect_stdout(io.StringIO()) as out, \
            contextlib.redirect_stderr(io.StringIO()) as err:
        status = cli.main(argv)
    _skip_for_data(status, err.getvalue(), command)
    assert status == 0, f"{command}\n{out.getvalue()[-2000:]}\n{err.getvalue()[-2000:]}"
    assert expected in out.getvalue(), f"{command}: no {expected} in\n{out.getvalue()[-2000:]}"


def _skip_for_data(status: int, err: str, command: Command) -> None:
    """A command that failed for want of data on a clone without ../shared: skipped, naming the fetch."""
    if status != 0 and not HAS_SHARED and any(reason in err for reason in NO_DATA):
        said = f"{err} {command}"
        names = sorted(name for name in SOURCES if re.search(rf"\b{name}\b", said)) or ["NAME"]
        missing_data(f"{command}: its data are not here and cannot be downloaded here (`dpadmm data fetch "
                     f"{' '.join(names)}` gets them): {err.strip().splitlines()[0][:200]}")


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
    else:  # an example app: its own split of the run config (settings.py, or task.py as Flower templates do)
        monkeypatch.syspath_prepend(str(app))
        module = "settings" if (app / app.name / "settings.py").exists() else "task"
        importlib.import_module(f"{app.name}.{module}").settings(fused)


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


@pytest.fixture(scope="module")
def fresh_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache of a fresh clone: empty at first, filled on first use from a file:// mirror of ../shared/data
    (the public sources' content, checked by the same SHA-256s)."""
    return tmp_path_factory.mktemp("cache")


FRESH_CLONE_PAGES = ("README.md", "docs/getting-started.md", "docs/families/")


def test_the_readme_and_family_pages_need_no_shared_folder() -> None:
    """What a newcomer runs from the README and the family pages reads data from the cache, not from a
    folder beside the checkout."""
    named = [str(c) for c in ALL
             if c.page.startswith(FRESH_CLONE_PAGES) and any("shared" in word for word in c.argv)]
    assert not named, named


def test_the_pages_have_commands() -> None:
    pages = {c.page for c in ALL}
    assert "README.md" in pages and "docs/getting-started.md" in pages
    assert len(ALL) > 50


# The documented commands that take 5-15 s each (100 agents on MNIST, the LEAF CNN and logistic regression on
# 195 writers, an audit of 200,000 trials) run in the full suite; the not-slow set keeps the others.
LONG = ("--num-agents 100 --partition dirichlet:0.1", "--model cnn --dataset femnist",
        "--model logistic --dataset femnist", "--trials 200000")


@pytest.mark.parametrize("command", [pytest.param(c, marks=pytest.mark.slow) if any(s in str(c) for s in LONG)
                                     else c for c in ALL], ids=str)
def test_every_documented_command_runs_as_written(command: Command, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path, fresh_cache: Path) -> None:
    monkeypatch.setenv("DPADMM_CACHE", str(fresh_cache))
    if HAS_SHARED:  # the public sources' content, checked by the same SHA-256s; else the sources themselves
        monkeypatch.setenv("DPADMM_DATA_MIRRORS", Path(SHARED).as_uri())
    else:
        monkeypatch.delenv("DPADMM_DATA_MIRRORS", raising=False)
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


# --- How the pages read: Markdown that renders as written, references, the API they name, offline math ---

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n]*\n.*?^ {0,3}\1[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.S)
DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.S)
INLINE_MATH = re.compile(r"(?<![\\$])\$(?=\S)[^$\n]*?(?<=\S)\$(?!\$)")
LINK_TARGET = re.compile(r"\]\([^)\s]*\)|<https?://[^>\s]*>|https?://\S+|<!--.*?-->", re.S)
# `*` with a letter or digit on both sides (`2**21`), or before a possessive (`2*'s`): CommonMark reads it as
# emphasis that pairs with the next star of the paragraph, and both stars vanish.
STAR_IN_WORD = re.compile(r"(?<=[^\W_])(?<!\\)\*+(?=[^\W_]|'[^\W\d_])")
# `_` that can close emphasis (after a non-space, before a space, punctuation or the end: `snake_case_`):
# with any `_` before it in the paragraph the text between them turns italic. The site writes emphasis
# with `*`, so no `_` may close one; an underscore inside a word (`z_p`) is inert and stays allowed.
UNDERSCORE_CLOSER = re.compile(r"(?<=\S)(?<![\\_])_+(?=[\s!-/:-@\[-^`{-~]|$)", re.M)


def _prose(text: str) -> str:
    """The page without what Markdown does not read for emphasis: fenced blocks, code spans, math, link
    targets and URLs (each replaced by blanks of the same lines, so line numbers stay)."""
    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    for pattern in (FENCE, CODE_SPAN, DISPLAY_MATH, INLINE_MATH, LINK_TARGET):
        text = pattern.sub(blank, text)
    return text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_emphasis_marker_inside_a_number_or_a_name(page: Path) -> None:
    """``2**21`` renders as "2" and a bold "21 ...", ``Algorithm 2*'s`` loses its star, ``a_name_`` turns
    italic: outside code, math and links such text goes in a code span (`` `2**21` ``) or is escaped
    (``2\\*'s``). Checked on README.md and every page of the site."""
    faults = []
    for number, line in enumerate(_prose(page.read_text()).splitlines(), 1):
        for pattern in (STAR_IN_WORD, UNDERSCORE_CLOSER):
            for match in pattern.finditer(line):
                around = line[max(0, match.start() - 30):match.end() + 30].strip()
                faults.append(f"{page.relative_to(ROOT)}:{number}: ...{around}...")
    assert not faults, "emphasis markers inside numbers or names:\n" + "\n".join(faults)


FAMILY_PAGES = sorted((ROOT / "docs" / "families").glob("*.md"))
RESULTS_PAGES = [ROOT / "docs" / "results.md", *sorted((ROOT / "docs" / "results").rglob("*.md"))]
# Pages whose references are still to be written by their owners (the audit table is edited elsewhere).
REFERENCES_PENDING = {"docs/results/audit/README.md"}
REFERENCES = re.compile(r"^(#{2,6}) References[ \t]*\n(.*?)(?=^#{1,6} |\Z)", re.S | re.M)
ENTRY = re.compile(r"^- (.*?)(?=^- |\Z)", re.S | re.M)
TITLE = re.compile(r"(?<![\\\w*])\*(?!\s)[^*]+?(?<!\s)\*(?!\*)")
LINK = re.compile(r"<https?://[^>\s]+>|\]\(https?://[^)\s]+\)")


@pytest.mark.parametrize("page", [p for p in FAMILY_PAGES + RESULTS_PAGES
                                  if str(p.relative_to(ROOT)) not in REFERENCES_PENDING],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_family_and_results_pages_list_their_references(page: Path) -> None:
    """Each family page and each results page ends with a "References" section: the papers (and the
    baselines it names) with authors, an italic title, venue and year, and at least one link."""
    section = REFERENCES.search(page.read_text())
    assert section, f"{page.relative_to(ROOT)} has no '## References' section"
    entries = [e.strip() for e in ENTRY.findall(section.group(2)) if e.strip()]
    assert entries, f"{page.relative_to(ROOT)}: the References section lists nothing"
    name = page.relative_to(ROOT)
    for entry in entries:
        assert TITLE.search(entry), f"{name}: a reference without an italic title: {entry[:80]}"
        assert re.search(r"\b(19|20)\d\d\b", entry) or LINK.search(entry), \
            f"{name}: a reference without a year or a link: {entry[:80]}"
    assert any(TITLE.search(e) and LINK.search(e) for e in entries), \
        f"{page.relative_to(ROOT)}: no reference has both a title and a link"


def _documented() -> tuple[set[str], set[str]]:
    """The modules the API reference documents whole, and the objects it documents one by one."""
    api = (ROOT / "docs" / "reference" / "api.md").read_text()
    modules = set(re.findall(r"automodule:: (\S+)", api))
    objects = set(re.findall(r"auto(?:function|class|method|data|attribute):: (\S+)", api))
    return modules, objects


def _is_documented(target: str, obj: object, modules: set[str], objects: set[str]) -> bool:
    owner = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None)
    return target in objects or owner in modules or f"{owner}.{name}" in objects


CALLS = re.compile(r"\b((?:dpadmm|strategies|clients)(?:\.[A-Za-z_]\w*)+)\(")
IMPORTS = re.compile(r"^\s*from ((?:dpadmm|strategies|clients)(?:\.\w+)*) import ([\w, ]+)$", re.M)


def test_every_function_the_pages_call_is_in_the_api_reference() -> None:
    """What a page tells its reader to import (``from strategies import DPIADMM``) or call
    (``dpadmm.iadmm.privacy.ledger(...)``) exists and has its docstring on the API reference page."""
    modules, objects = _documented()
    missing = []
    for page in PAGES:
        text = page.read_text()
        named: list[tuple[str, str]] = []
        for block in re.findall(r"```python\n(.*?)```", text, re.S):
            for module, names in IMPORTS.findall(block):
                named += [(module, n.strip()) for n in names.split(",") if n.strip()]
        for target in CALLS.findall(text):
            named.append(tuple(target.rsplit(".", 1)))  # type: ignore[arg-type]
        for module, name in named:
            obj = getattr(importlib.import_module(module), name, None)
            assert obj is not None, f"{page.relative_to(ROOT)}: {module}.{name} does not exist"
            if not _is_documented(f"{module}.{name}", obj, modules, objects):
                missing.append(f"{page.relative_to(ROOT)}: {module}.{name}")
    assert not missing, "not in docs/reference/api.md:\n" + "\n".join(sorted(set(missing)))


def test_the_math_renderer_and_its_fonts_ship_with_the_site() -> None:
    """KaTeX renders the equations with no network: the extension ships its script, docs/_static/katex holds
    KaTeX's stylesheet and every font it names, of the release the script is, and no MathJax (a CDN
    script) is configured. The built pages are checked by the build itself (docs/_ext/offline_check.py)
    and by the slow test below."""
    conf = (ROOT / "docs" / "conf.py").read_text()
    assert '"sphinxcontrib.katex"' in conf and "sphinx.ext.mathjax" not in conf
    css_path = re.search(r'^katex_css_path = "([^"]+)"', conf, re.M)
    assert css_path and not re.match(r"^(\w+:)?//", css_path.group(1)), "katex_css_path must be a local file"
    css = ROOT / "docs" / "_static" / css_path.group(1)
    fonts = re.findall(r"url\(([^)]+)\)", css.read_text())
    assert fonts and all((css.parent / font).is_file() for font in fonts), "a font it names is absent"
    assert "//" not in "".join(fonts)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["docs"]
    assert any(re.fullmatch(r"sphinxcontrib-katex==[\d.]+", spec) for spec in extra), \
        "pin sphinxcontrib-katex exactly: its katex.min.js must be the release of _static/katex"
    katex = pytest.importorskip("sphinxcontrib.katex")  # the docs extra; the release check needs it
    version = re.search(r'katex-version:after\{content:"([\d.]+)"\}', css.read_text())
    assert version and version.group(1) == katex.katex_version, \
        f"_static/katex is KaTeX {version and version.group(1)}, the extension's script {katex.katex_version}"


@pytest.mark.slow
def test_the_built_site_reads_offline(tmp_path: Path) -> None:
    """Build the site as CI does (warnings are errors) and check the output: no page loads anything from the
    network, and every equation of the family pages is wrapped for KaTeX's auto-render."""
    for module in ("sphinx", "myst_parser", "furo", "sphinxcontrib.katex"):
        pytest.importorskip(module)  # the docs extra: pip install -e ".[docs]"
    import subprocess

    out = tmp_path / "html"
    build = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                            str(ROOT / "docs"), str(out), "-d", str(tmp_path / "doctrees")],
                           capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        offline_check = importlib.import_module("offline_check")
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    assert offline_check.problems(out) == []
    page = (out / "families" / "iadmm.html").read_text()
    assert page.count('<div class="math') >= 5 and "\\[" in page and "\\(" in page
    assert not re.search(r"<script[^>]*mathjax", page, re.I) and "cdn.jsdelivr" not in page


def test_the_changelog_names_the_version_the_package_reports() -> None:
    """CHANGELOG.md's newest entry is the version pyproject.toml declares and the package reports (a user who
    upgrades reads there what changed), and the README points to it."""
    import dpadmm

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    entries = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - ", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert entries and entries[0] == declared == dpadmm.__version__, (entries, declared, dpadmm.__version__)
    assert "CHANGELOG.md" in (ROOT / "README.md").read_text()


# The figures the README and getting-started state for `dpadmm train` (the main job and its variants), each
# checked against what the command prints here, so a change of defaults fails the test until the pages say
# what the code does. The runs are deterministic (keyed streams, exact C kernels); the tolerance allows one
# test image (0.001) either way for another CPU's rounding, and 0.5% for the loss and the consensus violation.
MAIN_JOB_LINE = re.compile(r"round 10 test error ([\d.]+), train loss ([\d.]+), consensus violation ([\d.]+)")


def _train(args: tuple[str, ...], cwd: Path, env: dict[str, str] | None = None,
           command: str = "train") -> str:
    """What `dpadmm train ARGS` (or another ``command``) prints (stdout)."""
    done = subprocess.run([sys.executable, "-m", "dpadmm.cli", command,
                           *(["--no-progress"] if command == "train" else []), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _trained(args: tuple[str, ...], cwd: Path) -> tuple[float, float, float]:
    """(test error, train loss, consensus violation) after `dpadmm train ARGS`'s last round."""
    out = _train(args, cwd)
    found = MAIN_JOB_LINE.search(out)
    assert found, out[-2000:]
    error, loss, violation = (float(v) for v in found.groups())
    return error, loss, violation


def _stated(page: str, pattern: str) -> list[float]:
    found = re.search(pattern, (ROOT / page).read_text())
    assert found, f"{page} no longer states {pattern!r}"
    return [float(v) for v in found.groups()]


@pytest.mark.slow
def test_the_main_jobs_documented_figures_are_what_dpadmm_train_prints(tmp_path: Path) -> None:
    error, loss, violation = _trained((), tmp_path)
    for page in ("README.md", "docs/getting-started.md"):
        assert _stated(page, r"dpadmm: test error ([\d.]+);") == pytest.approx([error], abs=0.001), page
    stated = _stated("docs/getting-started.md", r"dpadmm round 10/10: test error ([\d.]+), train loss "
                                                r"([\d.]+), consensus violation ([\d.]+)")
    assert stated[0] == pytest.approx(error, abs=0.001)
    assert stated[1:] == pytest.approx([loss, violation], rel=0.005)
    # "(1,890 at round 1, 793 at round 10); ... falls from 0.220 after round 1", "here eps = 7.997": the run's
    # files, as the page reads them
    run = tmp_path / RunConfig().default_out()
    first = read_metrics(run)[0]
    text = (ROOT / "docs/getting-started.md").read_text()
    found = re.search(r"\(([\d,]+) at round 1, ([\d,]+) at round 10\)", text)
    assert found, "getting-started no longer states the consensus violation of rounds 1 and 10"
    assert [float(v.replace(",", "")) for v in found.groups()] == pytest.approx(
        [first["consensus-violation"], violation], abs=0.5 + 1e-9)
    assert _stated("docs/getting-started.md", r"falls from ([\d.]+) after round 1") == pytest.approx(
        [first["test-error"]], abs=0.001)
    spent = json.loads((run / "privacy.json").read_text())["whole_run"]["epsilon_pld"]
    assert _stated("docs/getting-started.md", r"here eps = ([\d.]+) at delta") == pytest.approx([spent],
                                                                                               abs=0.001)
    # "`dpadmm train --target-epsilon 4` gives 15.5%, 2 gives 18.5% and 1 gives 26.5%; the same steps without
    # noise (...) give 9.7%", and the main job over seeds 0-2
    page = "docs/getting-started.md"
    by_eps = _stated(page, r"--target-epsilon 4` gives ([\d.]+)%, 2 gives ([\d.]+)% and 1 gives ([\d.]+)%")
    runs = [_trained(("--target-epsilon", eps), tmp_path)[0] for eps in ("4", "2", "1")]
    assert by_eps == pytest.approx([100 * e for e in runs], abs=0.1 + 1e-9)
    noiseless = _stated(page, r"`--epsilon inf --target-epsilon 0`\) give ([\d.]+)%")
    assert noiseless == pytest.approx([100 * _trained(("--epsilon", "inf", "--target-epsilon", "0"),
                                                       tmp_path)[0]], abs=0.1 + 1e-9)
    seeds = [error] + [_trained(("--seed", s), tmp_path)[0] for s in ("1", "2")]
    mean = 100 * sum(seeds) / 3  # stated to 0.1 points
    assert _stated(page, r"its ([\d.]+)% \(seeds 0-2\)") == pytest.approx([mean], abs=0.1)


@dataclass(frozen=True)
class Figures:
    """Figures a page states for one of its `dpadmm train` (or `privacy`) commands: ``stated`` finds them
    on the page (its groups, in order), ``printed`` in what the command prints (the same figures, same
    order)."""

    page: str
    stated: str
    args: tuple[str, ...]
    printed: str
    data: str = ""  # the fixture of the data set the command reads (binary_dir, mnist_dir), if any
    percent: tuple[int, ...] = ()  # the figures (by position) the page gives in % of what is printed
    command: str = "train"  # or privacy

    def __str__(self) -> str:
        return f"{self.page}: dpadmm {self.command} {' '.join(self.args)}"


_N = r"(-?\d+(?:\.\d+)?(?:e-?\d+)?)"  # a figure on a page or in a command's output
_A9A = ("--algorithm", "dp-admm", "--dataset", "a9a", "--rounds", "50")
_A9A_LINE = rf"test accuracy {_N} \(always"
_PAPERS_MNIST = ("--preset", "papers", "--epsilon", "inf", "--dataset", "mnist", "--algorithm")
# The family pages' figures for their commands. The runs are deterministic (keyed streams), so a figure may
# differ from what the command prints by one unit of the last digit the page gives (its rounding, or another
# CPU's); a change of defaults fails the test until the page says what the code does.
FAMILY_FIGURES = (
    Figures("docs/families/decentral.md",
            rf"print the same numbers \(log-error {_N}, worst agent {_N},\s+consensus {_N}, "
            rf"{_N}-LDP\)",
            ("--algorithm", "ldp-admm", "--graph", "random", "--agents", "10", "--edges", "20"),
            rf"log-error {_N} \(worst agent {_N}\), consensus {_N};.* of the a-priori {_N}",
            data="binary_dir"),
    Figures("docs/families/linadmm.md",
            rf"objective {_N} \(averaged iterate {_N}\), test accuracy {_N} \(always predicting "
            rf"the majority class scores {_N}\)",
            (*_A9A, "--target-epsilon", "0.05", "--eta", "8"),
            rf"objective {_N} \(averaged iterate {_N}\), test accuracy {_N} \(always predicting "
            rf"the majority class scores {_N}\)", data="binary_dir"),
    Figures("docs/families/linadmm.md", rf"without noise \(`--target-epsilon inf`\) it reaches {_N}",
            (*_A9A, "--target-epsilon", "inf", "--eta", "8"), _A9A_LINE, data="binary_dir"),
    Figures("docs/families/linadmm.md", rf"the accuracy is still\s+{_N} \(",
            (*_A9A, "--target-epsilon", "0.05"), _A9A_LINE, data="binary_dir"),
    Figures("docs/families/linadmm.md", rf"the accuracy is still\s+\d+\.\d+ \({_N} without noise\)",
            (*_A9A, "--target-epsilon", "inf"), _A9A_LINE, data="binary_dir"),
    Figures("docs/families/iadmm.md", rf"The first ends at test error {_N} and train loss {_N}",
            ("--model", "mlp"), rf"round 10 test error {_N}, train loss {_N}"),
    Figures("docs/families/iadmm.md", rf"the second at\s+{_N} and {_N} \(2 cores, float64",
            ("--model", "mlp", "--target-epsilon", "4", "--rounds", "20"),
            rf"round 20 test error {_N}, train loss {_N}"),
    Figures("docs/families/iadmm.md",
            rf"runs with noise multiplier {_N} \(r[\s\S]*?ends at test error {_N} under",
            ("--model", "mlp", "--target-epsilon", "4", "--rounds", "20", "--batch-size", "32",
             "--sampling-rate", "1", "--neighbouring", "replace-one"),
            rf"noise multiplier {_N},[\s\S]*?round 20 test error {_N}"),
    *(Figures("docs/families/iadmm.md", stated, ("--preset", "papers", "--sensitivity", sensitivity),
              rf"round 50 test error {_N}")
      for sensitivity, stated in (("clipped", rf"C = 200 ends at test error {_N} after 50 rounds"),
                                  ("data-dependent", rf"against {_N} with the papers'\s+calibration"))),
    Figures("docs/families/sharing.md", r"on a9a sigma is ([\d,]+) per entry",
            ("--algorithm", "admm-sharing", "--epsilon", "1", "--rounds", "20"), rf"noise sigma = {_N} per",
            command="privacy"),
    Figures("docs/families/sharing.md",
            rf"reaches training objective {_N} and test error {_N}% in 100 rounds[\s\S]*?"
            rf"against {_N}% for always",
            ("--algorithm", "admm-sharing", "--dataset", "a9a", "--parties", "66,57", "--epsilon", "inf",
             "--rounds", "100"),
            rf"training objective {_N}, test log loss \S+, test error {_N} \(always predicting the majority "
            rf"class errs on {_N}\)", data="binary_dir", percent=(1, 2)),
    Figures("docs/families/decentral.md", rf"the first command's agents realise {_N} of\s+the a-priori {_N}",
            ("--algorithm", "ldp-admm", "--graph", "random", "--agents", "10", "--edges", "20",
             "--sensitivity", "0.01"),
            rf"ex-post loss {_N} of the a-priori {_N}", data="binary_dir"),
    *(Figures("docs/families/decentral.md", stated,
              ("--algorithm", "ldp-admm", "--partition", partition, "--rounds", "40", "--noise", "none"),
              rf"log-error {_N} \(worst", data="binary_dir")
      for partition, stated in (("contiguous", rf"the log-error at iteration 40 is {_N}\s+\(contiguous\)"),
                                ("dirichlet:0.1", rf"{_N} \(`dirichlet:0.1`\)"),
                                ("shards:1", rf"{_N} \(`shards:1`\)"))),
    *(Figures("docs/families/linadmm.md", stated,
              ("--algorithm", "dp-accadmm", "--restart", restart, "--target-epsilon", "inf", "--dataset",
               "a9a", "--rounds", "400", "--eta", "8"), rf"objective {_N} \(averaged", data="binary_dir")
      for restart, stated in (("none", rf"the objective is {_N}\s+without restart"),
                              ("goldstein", rf"without restart and {_N} with it"))),
    # the reference code's facts: ObjP's test error is that of our model after round 40, its consensus
    # violation round 41's; OutP's both round 41's (tests/test_engine.py::test_reference_facts_on_mnist)
    Figures("docs/testing.md", rf"\| ObjP \| {_N} \|",
            (*_PAPERS_MNIST, "objp", "--rounds", "40", "--eval-every", "40"),
            rf"round 40 test error {_N}", data="mnist_dir"),
    Figures("docs/testing.md", rf"\| ObjP \| \d+\.\d+ \| {_N} \|",
            (*_PAPERS_MNIST, "objp", "--rounds", "41", "--eval-every", "41"),
            rf"round 41 test error \S+, train loss \S+, consensus violation {_N}", data="mnist_dir"),
    Figures("docs/testing.md", rf"\| OutP \| {_N} \| {_N} \|",
            (*_PAPERS_MNIST, "outp", "--rounds", "41", "--eval-every", "41"),
            rf"round 41 test error {_N}, train loss \S+, consensus violation {_N}", data="mnist_dir"),
    Figures("docs/testing.md", rf"in `float32` the ObjP consensus violation comes out as {_N}",
            (*_PAPERS_MNIST, "objp", "--rounds", "41", "--eval-every", "41", "--dtype", "float32"),
            rf"consensus violation {_N}", data="mnist_dir"),
)


def _last_digit(figure: str) -> float:
    """One unit of a figure's last written digit: 0.001 for "0.147", 1 for "40", 1e-6 for "6.652e-3"."""
    mantissa, _, exponent = figure.partition("e")
    unit = 10.0 ** -len(mantissa.split(".")[1]) if "." in mantissa else 1.0
    return unit * 10.0 ** int(exponent or 0)


@pytest.mark.slow
@pytest.mark.parametrize("figures", FAMILY_FIGURES, ids=str)
def test_the_family_pages_figures_are_what_their_commands_print(figures: Figures, tmp_path: Path,
                                                                request: pytest.FixtureRequest) -> None:
    found = re.search(figures.stated, (ROOT / figures.page).read_text())
    assert found, f"{figures.page} no longer states {figures.stated!r}"
    env = dict(os.environ)
    if figures.data:  # the data set from ../shared/data (a file:// mirror) or the cache, as a user's run
        folder = request.getfixturevalue(figures.data)
        if folder.is_relative_to(SHARED_DATA):
            env["DPADMM_DATA_MIRRORS"] = SHARED_DATA.as_uri()
    out = _train(figures.args, tmp_path, env, figures.command)
    printed = re.search(figures.printed, out)
    assert printed, out[-2000:]
    for i, (written, value) in enumerate(zip(found.groups(), printed.groups(), strict=True)):
        stated = written.replace(",", "")  # 17,485
        scale = 100.0 if i in figures.percent else 1.0
        assert scale * float(value) == pytest.approx(float(stated), abs=_last_digit(stated) + 1e-12), (
            f"{figures}: the page states {stated}, the command prints {value}")
