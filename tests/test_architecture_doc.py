"""ARCHITECTURE.md's module index names every module of app/ and engine/: a module added without
its line (or a line left behind by a module that went) fails here, so the map stays the code's."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules() -> set[str]:
    files = subprocess.run(
        ["git", "ls-files", "app/*.py", "engine/*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    names = set()
    for f in files:
        if f.endswith("/__init__.py"):
            if f.count("/") > 1:  # a subpackage: named by its folder
                names.add(f.rsplit("/", 1)[0] + "/")
        else:
            names.add(f)
    return names


def _indexed() -> set[str]:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text.split("## Module index", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))


def test_every_module_has_its_line_in_the_architecture_index():
    assert _modules() - _indexed() == set()


def test_the_index_names_no_module_that_is_gone():
    assert _indexed() - _modules() == set()
