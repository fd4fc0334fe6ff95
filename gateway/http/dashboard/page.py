"""The dashboard page and its static files, served from the package (no CDN, no build step).

`GET /dashboard` answers `static/index.html`; `GET /dashboard/static/{name}` answers one of the
files shipped in `static/` (looked up by exact name: nothing outside that folder is reachable).
Every answer carries a strict Content-Security-Policy: scripts, styles and API calls from this
origin only, no inline script, no framing.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import NoRoute

STATIC = Path(__file__).resolve().parent / "static"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".md": "text/markdown; charset=utf-8",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-cache",
}


@lru_cache(maxsize=1)
def shipped() -> dict[str, Path]:
    """The files the page may load, by name."""
    return {p.name: p for p in STATIC.iterdir() if p.is_file() and p.suffix in MEDIA_TYPES}


def file_response(name: str) -> Response:
    path = shipped().get(name)
    if path is None:
        raise NoRoute(f"No route for that URI: /dashboard/static/{name}")
    return Response(path.read_bytes(), media_type=MEDIA_TYPES[path.suffix], headers=SECURITY_HEADERS)


async def index(request: Request) -> Response:
    return file_response("index.html")


async def static(request: Request) -> Response:
    return file_response(request.path_params["name"])
