"""The dashboard at /ui: static HTML/CSS/JS modules shipped in this package (no build step, no
CDN). It reads the same public JSON endpoints as any client (/health, /state, /cost)."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent


async def _to_index(request: Request) -> Response:
    # The page loads its modules by relative URL, so it must be served from /ui/.
    return RedirectResponse(request.url.replace(path=request.url.path + "/"), status_code=308)


def ui_routes() -> list[BaseRoute]:
    """GET /ui redirects to /ui/, which serves index.html; /ui/* serves the static files."""
    return [
        Route("/ui", _to_index, methods=["GET", "HEAD"]),
        Mount("/ui", app=StaticFiles(directory=STATIC_DIR, html=True), name="ui"),
    ]
