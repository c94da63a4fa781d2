"""/docs (Swagger UI) and /redoc (ReDoc), their scripts and styles served by the node from the
``fastapi-offline`` package: no CDN. A policy keeps the pages from loading anything from
elsewhere (ReDoc's bundle would fetch its maker's logo)."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = Path(fastapi_offline.__file__).parent / "static"
ASSETS_URL = "/docs/assets"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
# the pages start their viewer with an inline script; ReDoc searches in a blob: worker
POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self' 'unsafe-inline'; worker-src 'self' blob:; connect-src 'self'; "
    "frame-ancestors 'none'"
)


def add_docs(app: FastAPI, favicon_url: str) -> None:
    """Serve the API docs of ``app`` (made with ``docs_url=None, redoc_url=None``)."""
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    def page(response: HTMLResponse) -> HTMLResponse:
        response.headers["Content-Security-Policy"] = POLICY
        return response

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return page(
            get_swagger_ui_html(
                openapi_url=root + openapi_url,
                title=f"{app.title} - Swagger UI",
                oauth2_redirect_url=root + OAUTH2_REDIRECT_URL,
                swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
                swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
                swagger_favicon_url=root + favicon_url,
            )
        )

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return page(get_swagger_ui_oauth2_redirect_html())

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return page(
            get_redoc_html(
                openapi_url=root + openapi_url,
                title=f"{app.title} - ReDoc",
                redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
                redoc_favicon_url=root + favicon_url,
                with_google_fonts=False,
            )
        )
