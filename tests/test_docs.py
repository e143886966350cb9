"""The design in the repo stays true: the documentation site builds strictly (broken links and
anchors fail), the generated method catalogue matches the code, the architecture page's floors
match the import graph, nothing cites a file a user who clones the repository does not have,
and the README stays a short tour."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def load_docs_module(name: str):
    """A module of docs/ (a folder of pages, not a package) loaded from its file."""
    spec = importlib.util.spec_from_file_location(f"docs_{name}", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # what a dataclass in it looks itself up in
    spec.loader.exec_module(module)
    return module


def test_site_builds_strictly(tmp_path):
    """Sphinx with every warning an error: a link to a missing page or heading, a page left out
    of the navigation, a broken include or directive fails the build."""
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    assert (tmp_path / "html" / "methods.html").is_file()


def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The build above can fail: the same command on a copy of the site with one dead link."""
    import shutil

    copy = tmp_path / "docs"
    shutil.copytree(DOCS, copy, ignore=shutil.ignore_patterns("_build"))
    for page in ("changelog.md", "datasets.md"):  # their includes name files beside docs/
        (copy / page).write_text((DOCS / page).read_text().replace("../", f"{ROOT}/"))
    (copy / "index.md").write_text((DOCS / "index.md").read_text()
                                   + "\nSee [nothing](results.md#no-such-heading).\n")
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
         str(copy), str(tmp_path / "html")], capture_output=True, text=True, timeout=300)
    assert build.returncode != 0
    assert "no-such-heading" in build.stderr


def test_navigation_lists_every_page_and_only_pending_pages_are_missing():
    conf = load_docs_module("conf")
    listed = [page for _, pages in conf.NAV for page in pages]
    pages = {p.stem for p in DOCS.glob("*.md")} - {conf.root_doc}
    assert sorted(pages - set(listed)) == [], "add these pages to NAV in docs/conf.py"
    missing = {page for page in listed if not conf.present(page)}
    assert missing == set(conf.PENDING) & missing, (
        f"{sorted(missing - set(conf.PENDING))} are in NAV but have no file under docs/")
    landed = sorted(page for page in conf.PENDING if conf.present(page))
    assert landed == [], f"{landed} landed: remove them from PENDING in docs/conf.py"


def test_catalogue_leaves_out_methods_registered_from_outside_the_package():
    """A plugin method registered in this process (the contract suite registers one in the same
    worker) is not raylf's, so the committed catalogue stays what the package holds."""
    from raylf.methods import METHODS
    from raylf.methods.fedavg import FedAvg

    catalogue = load_docs_module("catalogue")
    outsider = type("Outsider", (FedAvg,), {"__module__": "tests.plugins.outsider"})
    with METHODS.temporarily("outsider_method", outsider):
        assert "outsider_method" not in catalogue.raylf_methods()
        assert "outsider_method" not in catalogue.render()


def test_method_catalogue_is_current():
    catalogue = load_docs_module("catalogue")
    assert (DOCS / "methods.md").read_text() == catalogue.render(), (
        "docs/methods.md is stale: run python docs/catalogue.py")


def test_every_method_parameter_has_a_description():
    catalogue = load_docs_module("catalogue")
    missing = {name: catalogue.undescribed(cls.Params)
               for name, cls in catalogue.raylf_methods().items()}
    assert {name: fields for name, fields in missing.items() if fields} == {}, (
        "give these fields a Field(description=...)")


# ---- no reference to files outside the repository --------------------------------------------
# The team's design notes and the papers' text files are not in the repository: cite a paper by
# its title and section, and raylf's own design by the page of docs/ that holds it.
OUTSIDE = re.compile(
    r"DESIGN\.md|ray-notes|/work/shared|\.\./shared|shared/(?:seeds|specs)|specs/methods\.md"
    r"|\bspec [A-E](?:\.\d+)?\b|\bseed 00\d\b|\bseed (?:Table|Figure|Appendix)")
# in the package even a bare "methods.md" was the team's spec (the catalogue is docs' business)
OUTSIDE_IN_PACKAGE = re.compile(OUTSIDE.pattern + r"|methods\.md")
SEARCHED = ("raylf", "docs", "tune", "notebooks", "datasets", "cluster", "README.md",
            "CHANGELOG.md")
# places another change is rewriting, each with that change: the test asks for the entry to go
# once the place is clean
AWAITING: dict[str, str] = {}


def outside_references() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for top in SEARCHED:
        path = ROOT / top
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            rel = file.relative_to(ROOT).as_posix()
            if "/_build/" in rel or file.suffix in {".png", ".pyc", ".npz", ".parquet"}:
                continue
            pattern = OUTSIDE_IN_PACKAGE if rel.startswith("raylf/") else OUTSIDE
            for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
                if pattern.search(line):
                    found.setdefault(rel, []).append(f"{rel}:{number}: {line.strip()}")
    return found


def test_nothing_cites_a_file_outside_the_repository():
    found = outside_references()
    hits = [line for rel, lines in found.items() for line in lines
            if not any(rel.startswith(place) for place in AWAITING)]
    assert hits == [], "cite the paper by title and section, or the docs page:\n" + "\n".join(hits)
    clean = [place for place in AWAITING if not any(rel.startswith(place) for rel in found)]
    assert clean == [], f"{clean} no longer cite outside files: remove them from AWAITING"


def test_reference_check_finds_what_it_looks_for():
    for line in ("(methods.md D8)", "spec A.5", "seed 000 Table 5", "see DESIGN.md",
                 "seed Table 10", "/work/shared/seeds/000.txt"):
        assert OUTSIDE_IN_PACKAGE.search(line), line
    for line in ("docs/methods.md", "[Method catalogue](methods.md)", "seed 0", "seeds 42"):
        assert not OUTSIDE.search(line), line


# ---- the README is a short tour -----------------------------------------------------------------
MARKDOWN = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]


def test_readme_is_a_short_tour():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail to docs/"


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "CHANGELOG.md"],
                         ids=lambda p: p.name)
def test_links_outside_the_site_lead_to_files(page):
    """README.md and CHANGELOG.md are read on their own (the site's build checks its pages):
    every relative link names a file of the repository."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    dead = [t for t in targets if "://" not in t and not (page.parent / t).exists()]
    assert dead == []


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_table_cell_is_a_wall_of_text(page):
    long = [(number, len(cell)) for number, line in enumerate(page.read_text().splitlines(), 1)
            if line.startswith("|") for cell in line.strip("|").split(" | ") if len(cell) > 600]
    assert long == [], f"table cells over 600 characters (line, length): {long}"




def test_leaderboard_lists_every_method_of_its_sweep_on_each_split():
    """docs/leaderboard.md is a measurement of tune/pfl_methods.yaml: a method entry added to
    the sweep without a new run (or a split left out) shows here."""
    import yaml

    entries = yaml.safe_load((ROOT / "tune" / "pfl_methods.yaml").read_text())["methods"]
    page = (DOCS / "leaderboard.md").read_text()
    sections = page.split("\n## ")[1:]
    splits = [s for s in sections if s.startswith("digits")]
    assert len(splits) == 2
    for section in splits:
        rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
        assert len(rows) == len(entries), section.splitlines()[0]
        methods = {row.split(" | ")[0].removeprefix("| ").split("(")[0].strip() for row in rows}
        assert methods == {entry["name"] for entry in entries}


def test_leaderboard_verdicts_follow_the_test_and_the_sign():
    import pandas as pd

    leaderboard = load_docs_module("leaderboard")
    keys = pd.MultiIndex.from_product([[0, 1], range(10)], names=["seed", "client_id"])
    base = pd.Series(0.5, index=keys)
    gains = pd.Series([0.01 * (i + 1) for i in range(20)], index=keys)
    assert leaderboard.verdict(leaderboard.versus(base + gains, base)) == "beats"
    assert leaderboard.verdict(leaderboard.versus(base - gains, base)) == "behind"
    mixed = gains * [1 if i % 2 else -1 for i in range(20)]
    assert leaderboard.verdict(leaderboard.versus(base + mixed, base)) == "ties"
    # most clients gain a little, two lose much: the mean falls, the ranks say beats
    skewed = pd.Series([0.01] * 18 + [-0.2, -0.2], index=keys)
    result = leaderboard.versus(base + skewed, base)
    assert result.paired.delta < 0 and leaderboard.verdict(result) == "beats"
    assert leaderboard.verdict(None) == "-"
