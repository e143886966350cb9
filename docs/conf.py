"""The documentation site: Markdown pages (MyST) built by Sphinx with the Furo theme.

Why not MkDocs: its last release (1.6.1) is from August 2024, and Material for MkDocs declares
itself inactive (end of life May 2027); Zensical, its successor, was at 0.1 and its current
release did not install from the package index. Sphinx, MyST-Parser and Furo are maintained, keep
the pages plain Markdown that also reads on GitHub, and their strict build fails on a link to a
missing page or heading and on a page missing from the navigation.

Build it as the test suite does (tests/test_docs.py), strict, every warning an error:

    python -m sphinx -W --keep-going -n -b html docs docs/_build/html

A page joins the site by one line in ``NAV`` below; the sidebar and the home page's table of
contents are built from it. A page another change is still writing is named in ``PENDING``: it
stays out of the build until its file lands, and the test then asks for its ``PENDING`` line to
go, so the entry cannot linger.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent

project = "raylf"
author = "the raylf authors"
copyright = "the raylf authors, Apache-2.0"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
html_theme = "furo"
html_title = "raylf"
html_static_path: list[str] = []
# links to a heading of another page (`storage.md#resume`) are checked like links to pages
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
suppress_warnings: list[str] = []

# (section, [page, ...]): the sidebar, in order; pages are file names under docs/ without ".md"
NAV: list[tuple[str, list[str]]] = [
    ("Using raylf", ["experiments", "sweeps", "results", "reports", "claims", "datasets"]),
    ("Methods", ["methods", "leaderboard", "method-contract"]),
    ("How it works", ["architecture", "runtime", "storage", "performance", "security"]),
    ("Project", ["changelog"]),
]
# pages named in NAV whose files other work in progress adds (page: who writes it)
PENDING: dict[str, str] = {}


def present(page: str) -> bool:
    return (HERE / f"{page}.md").is_file()


def nav_toctrees() -> str:
    """The sidebar as MyST toctree directives, one per NAV section, of the pages present."""
    blocks = []
    for caption, pages in NAV:
        shown = [page for page in pages if present(page)]
        if shown:
            blocks.append("\n```{toctree}\n:hidden:\n:caption: " + caption + "\n\n"
                          + "\n".join(shown) + "\n```\n")
    return "".join(blocks)


def add_nav(app, docname: str, source: list[str]) -> None:
    if docname == root_doc:
        source[0] += nav_toctrees()


def setup(app):
    app.connect("source-read", add_nav)
