"""The usage dashboard: a page at /dashboard over a small JSON API (ledger + live figures).

`dashboard_routes()` gives the routes to mount on a listener; `api.dashboard_scope` is the one
auth check (admin token: every tenant; a tenant's API key: its own).

    page.py     the page and its static files, served from the package
    api.py      the JSON API: thin handlers over `summary`, scoped by `dashboard_scope`
    summary.py  ledger records (and a few live figures) folded into one summary
    limits.py   how many usage queries one tenant may run at once in this process
"""

from __future__ import annotations

from starlette.routing import Route

from gateway.http.dashboard import api, page


def dashboard_routes() -> list[Route]:
    return [
        Route("/dashboard", page.index, methods=["GET"]),
        Route("/dashboard/static/{name}", page.static, methods=["GET"]),
        Route("/dashboard/api/usage", api.usage, methods=["GET"]),
        Route("/dashboard/api/tenants", api.tenants, methods=["GET"]),
    ]


__all__ = ["dashboard_routes"]
