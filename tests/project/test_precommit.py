"""``.pre-commit-config.yaml`` runs the lint part of the test command, with the same tools.

Each hook's command is one ``tests/run.sh`` runs from ``.venv``, and each tool it installs
has the requirement ``pyproject.toml`` gives it (mypy's Django at the test command's 5.2):
a bound raised in one place and not the other fails here, not as a hook that passes what
the test command refuses.
"""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.paths import ROOT


def hooks() -> dict[str, dict[str, list[str]]]:
    """Each hook of the (flat, local) configuration: its ``entry`` and its dependencies."""
    found: dict[str, dict[str, list[str]]] = {}
    hook: dict[str, list[str]] = {}
    in_deps = False
    for line in (ROOT / ".pre-commit-config.yaml").read_text().splitlines():
        text = line.split(" #")[0].strip()
        if text.startswith("- id:"):
            hook = found.setdefault(text.split(":", 1)[1].strip(), {"entry": [], "deps": []})
            in_deps = False
        elif text.startswith("entry:"):
            hook["entry"] = [text.split(":", 1)[1].strip()]
        elif text.startswith("additional_dependencies:"):
            inline = text.split(":", 1)[1].strip()
            hook["deps"] = re.findall(r'"([^"]+)"', inline)
            in_deps = not inline
        elif in_deps and text.startswith("- "):
            hook["deps"].append(text[2:].strip().strip('"'))
        elif text and not text.startswith("#"):
            in_deps = False
    return found


def requirements() -> dict[str, Requirement]:
    """Every requirement ``pyproject.toml`` states, by name; Django as the test command's .venv."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    stated = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        stated += extra
    found = {canonicalize_name(Requirement(r).name): Requirement(r) for r in stated}
    [django] = re.findall(r'\[5\.2\]="(django[^"]+)"', (ROOT / "tests/run.sh").read_text())
    found["django"] = Requirement(django)
    return found


def lint_commands() -> set[str]:
    """The commands ``tests/run.sh`` runs from ``.venv/bin``, each whole (up to ``>`` or ``||``)."""
    found = set()
    for line in (ROOT / "tests/run.sh").read_text().splitlines():
        for command in re.findall(r"\.venv/bin/([^>|]+)", line.split("#")[0]):
            found.add(command.strip())
    return found


def test_each_hook_runs_a_command_of_the_test_command():
    entries = {name: hook["entry"] for name, hook in hooks().items()}
    assert set(entries) == {"ruff-check", "ruff-format", "mypy", "lint-imports"}
    commands = lint_commands()
    for name, [entry] in entries.items():
        assert entry in commands, (name, entry, commands)


def test_each_tool_has_pyprojects_requirement():
    wanted = requirements()
    installed = [Requirement(dep) for hook in hooks().values() for dep in hook["deps"]]
    assert {canonicalize_name(r.name) for r in installed} >= {
        "ruff",
        "mypy",
        "django-stubs",
        "import-linter",
    }
    for requirement in installed:
        assert str(requirement) == str(wanted[canonicalize_name(requirement.name)]), requirement
