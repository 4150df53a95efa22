"""`/docs`: Swagger UI served from the installed `fastapi-offline` package.

FastAPI's default page loads Swagger UI's script and styles from a CDN, so
it is blank on a machine without the internet (or behind a strict proxy).
Here the page and every asset it loads come from the service itself, at
`/docs/assets/`, open without a key like the page and `/openapi.json`. The
files are those `fastapi-offline` ships (Swagger UI 5, which reads the
OpenAPI 3.1 FastAPI writes; `swagger-ui-bundle` ships Swagger UI 3, which
cannot); only its static files are used, not its `FastAPI` subclass.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

__all__ = ["ASSETS", "install_docs"]

_FILES = Path(fastapi_offline.__file__).parent / "static"

ASSETS = "/docs/assets"
"""Where Swagger UI's files are served (open, like `/docs`)."""


def install_docs(app: FastAPI) -> None:
    """Serve `/docs` (and its OAuth2 redirect) with Swagger UI's assets from the package."""
    app.mount(ASSETS, StaticFiles(directory=_FILES), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url="/docs/oauth2-redirect",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
            # The validator badge would send the schema to validator.swagger.io.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()
