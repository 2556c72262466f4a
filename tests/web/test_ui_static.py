"""The dashboard's static files: served at /ui by the app, complete, and free of HTML sinks.
(The browser checks are in tests/ui, run by `make test-ui`.)"""

from __future__ import annotations

import re
from pathlib import Path

from starlette.testclient import TestClient

from skillstate.app import create_app
from skillstate.config import Settings
from skillstate.ui import STATIC_DIR

IMPORT = re.compile(r"""^import .* from "(\.[^"]+)";$""", re.MULTILINE)


def test_ui_is_served_from_the_package(tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path)
    with TestClient(create_app(s), base_url="http://localhost") as c:  # a loopback Host
        r = c.get("/ui", follow_redirects=False)
        assert r.status_code == 308 and r.headers["location"].endswith("/ui/")
        index = c.get("/ui/")
        assert index.status_code == 200 and "text/html" in index.headers["content-type"]
        assert '<script type="module" src="app.js">' in index.text
        js = c.get("/ui/pages/session.js")
        assert js.status_code == 200 and "javascript" in js.headers["content-type"]
        assert c.get("/ui/nope.js").status_code == 404


def test_every_module_import_resolves() -> None:
    modules = sorted(STATIC_DIR.rglob("*.js"))
    assert len(modules) >= 8
    for m in modules:
        for target in IMPORT.findall(m.read_text()):
            assert (m.parent / target).resolve().is_file(), f"{m.name} imports missing {target}"


def test_no_html_sinks_and_no_remote_assets() -> None:
    # Session state holds untrusted model text: the UI builds every node with textContent.
    for f in [*STATIC_DIR.rglob("*.js"), *STATIC_DIR.rglob("*.html"), *STATIC_DIR.rglob("*.css")]:
        text = f.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, f"{f.name} uses {sink}"
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), f"{f.name}: remote asset"


def test_only_the_dashboards_assets_are_served(tmp_path: Path) -> None:
    """/ui/ served the whole package folder, this module's source and (installed) its
    bytecode included, to anyone: the dashboard's files need no key."""
    import importlib.util
    import py_compile

    import skillstate.ui

    pyc = Path(importlib.util.cache_from_source(skillstate.ui.__file__))
    if not pyc.is_file():  # not written on import (PYTHONDONTWRITEBYTECODE): as installed
        py_compile.compile(skillstate.ui.__file__, cfile=str(pyc), doraise=True)
    assert pyc.is_file()
    s = Settings(data_dir=tmp_path)
    with TestClient(create_app(s), base_url="http://localhost") as c:
        for path in ("__init__.py", f"__pycache__/{pyc.name}", "__pycache__/", "pages/"):
            r = c.get(f"/ui/{path}")
            assert r.status_code == 404, (path, r.status_code)
        for f in sorted(STATIC_DIR.rglob("*")):
            if f.is_file() and f.suffix in (".html", ".css", ".js"):
                assert c.get(f"/ui/{f.relative_to(STATIC_DIR)}").status_code == 200, f
