"""dpadmm.runs.references: the one copy of the entries the generated results pages cite, and those pages.

The generators write each page's ``## References`` section from it, so a regenerated page keeps the
section the docs need (tests/test_docs.py); these tests keep the committed pages, the hand-written family
pages and the code saying the same thing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import compare_dp, compare_dp_terms
from dpadmm.decentral import reproduce as decentral
from dpadmm.iadmm import reproduce as iadmm
from dpadmm.linadmm import reproduce as linadmm
from dpadmm.runs import references
from dpadmm.sharing import reproduce as sharing

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
# Each generated page and the keys its generator cites. Pages whose runs are not committed (mnist-t1000 and
# the top-level summary.md) cannot be rebuilt here, but their generator is the same as t20000's.
GENERATED = {
    "t20000/summary.md": iadmm.REFERENCES,
    "mnist-t1000/summary.md": iadmm.REFERENCES,
    "summary.md": iadmm.REFERENCES,
    "001/summary.md": sharing.REFERENCES,
    "002/summary.md": linadmm.REFERENCES,
    "004/summary.md": decentral.REFERENCES,
    "compare/table.md": compare_dp.REFERENCES,
    "models/table.md": compare_dp.REFERENCES,
    "compare/terms.md": compare_dp_terms.REFERENCES,
}


@pytest.mark.parametrize("page", GENERATED)
def test_each_generated_page_ends_with_the_section_its_generator_writes(page: str) -> None:
    """The committed page was written (or, where its runs are not committed, edited) to end as the code
    ends it: regenerating it drops nothing and adds nothing."""
    expected = "\n\n" + "\n".join(references.section(GENERATED[page])) + "\n"
    assert (RESULTS / page).read_text().endswith(expected)


def test_every_entry_reads_as_on_its_family_page() -> None:
    """The hand-written family pages list the same works: their copy of each entry is the code's, word for
    word and line for line, so the site never shows two versions of one reference."""
    family = "\n".join(p.read_text() for p in sorted((ROOT / "docs" / "families").glob("*.md")))
    missing = [key for key, entry in references.ENTRIES.items()  # a whole item: no more lines of it after
               if not re.search("^" + re.escape(entry) + r"\n(?!  )", family, re.M)]
    assert not missing, f"entries not on any family page as written here: {missing}"


def test_every_entry_is_one_item_with_an_italic_title_and_a_year_or_a_link() -> None:
    """What tests/test_docs.py asks of a References entry, checked where the entries are written."""
    for key, entry in references.ENTRIES.items():
        assert entry.startswith("- ") and "\n- " not in entry, key
        assert all(line.startswith("  ") for line in entry.splitlines()[1:]), key  # one list item
        assert re.search(r"(?<![\\\w*])\*(?!\s)[^*]+?(?<!\s)\*(?!\*)", entry), f"{key}: no italic title"
        assert re.search(r"\b(19|20)\d\d\b|<https?://", entry), f"{key}: no year and no link"


def test_a_section_lists_the_keys_in_order_and_refuses_unknown_ones() -> None:
    lines = references.section(("004", "huang2015"))
    assert lines[:2] == ["## References", ""]
    assert lines[2:] == [references.ENTRIES["004"], references.ENTRIES["huang2015"]]
    with pytest.raises(ValueError, match=r"\['nobody2030'\] are not allowed"):
        references.section(("003", "nobody2030"))
    with pytest.raises(ValueError, match="none are not allowed"):
        references.section(())
