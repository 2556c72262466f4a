"""The dashboard at /ui: static HTML/CSS/JS modules shipped in this package (no build step, no
CDN). It reads the same public JSON endpoints as any client (/health, /state, /cost)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent
# What the dashboard is made of (pyproject's package-data for this folder): the folder also
# holds this module and, installed, its __pycache__, which are not served.
ASSET_SUFFIXES = (".html", ".css", ".js")


class _Assets(StaticFiles):
    """StaticFiles serving the dashboard's assets only: any other file is a 404."""

    def lookup_path(self, path: str) -> tuple[str, os.stat_result | None]:
        full_path, found = super().lookup_path(path)
        regular = found is not None and stat.S_ISREG(found.st_mode)
        if regular and not full_path.endswith(ASSET_SUFFIXES):
            return "", None
        return full_path, found


async def _to_index(request: Request) -> Response:
    # The page loads its modules by relative URL, so it must be served from /ui/.
    return RedirectResponse(request.url.replace(path=request.url.path + "/"), status_code=308)


def ui_routes() -> list[BaseRoute]:
    """GET /ui redirects to /ui/, which serves index.html; /ui/* serves the static files."""
    return [
        Route("/ui", _to_index, methods=["GET", "HEAD"]),
        Mount("/ui", app=_Assets(directory=STATIC_DIR, html=True), name="ui"),
    ]
