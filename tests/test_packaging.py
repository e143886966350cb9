"""What a package is expected to have: a console script for every command a user types, each
resolving to a callable, and the licence pyproject declares shipped as the file it names."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# each `python -m raylf.X` a page of docs/ or README.md tells a user to type, by its script name
COMMANDS = {
    "raylf-run": "raylf.run",
    "raylf-sweep": "raylf.sweep",
    "raylf-report": "raylf.report",
    "raylf-datasets": "raylf.datasets",
    "raylf-results": "raylf.results",
    "raylf-diagnostics": "raylf.diagnostics",
}


def test_every_command_has_a_console_script():
    scripts = PYPROJECT["project"]["scripts"]
    assert sorted(scripts) == sorted(COMMANDS)
    for name, module in COMMANDS.items():
        target = scripts[name].split(":")[0]
        assert target == module or target.startswith(module + "."), (name, scripts[name])


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_console_script_resolves_to_a_callable(name):
    """The script's `module:function` imports and is callable, as the installed wrapper calls it
    (``sys.exit(function())``)."""
    module, _, attribute = PYPROJECT["project"]["scripts"][name].partition(":")
    entry = getattr(importlib.import_module(module), attribute)
    assert callable(entry)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_console_script_prints_its_usage(name, capsys):
    """``--help`` through the entry function itself: argparse exits 0 with a usage line, so the
    script is the command's real parser, not a placeholder."""
    module, _, attribute = PYPROJECT["project"]["scripts"][name].partition(":")
    entry = getattr(importlib.import_module(module), attribute)
    with pytest.raises(SystemExit) as stop:
        entry(["--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")


def test_licence_file_is_the_declared_apache_text():
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    text = (ROOT / project["license-files"][0]).read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
