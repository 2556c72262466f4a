"""What the package promises every supported interpreter (CPython 3.10+, pyproject's
requires-python): each module compiles. The unit tier runs on each version (.ci/run), so
syntax newer than 3.10 fails here rather than at a user's import."""

from __future__ import annotations

from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "skillstate"
MODULES = sorted(SRC.rglob("*.py"))


def test_the_package_has_modules() -> None:
    assert len(MODULES) > 20 and SRC / "cli" / "main.py" in MODULES


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_every_module_compiles_on_this_python(path: Path) -> None:
    compile(path.read_text(encoding="utf-8"), str(path), "exec", dont_inherit=True)
