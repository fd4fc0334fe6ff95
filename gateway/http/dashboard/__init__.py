"""The usage dashboard: a page at /dashboard over a small JSON API (ledger + live figures).

`dashboard_routes()` gives the routes to mount on a listener; `api.dashboard_scope` is the one
auth check (admin token: every tenant; a tenant's API key: its own).
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
