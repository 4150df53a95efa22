"""`/docs`: Swagger UI served from the installed `swagger-ui-bundle` package.

FastAPI's default page loads Swagger UI's script and styles from a CDN, so
it is blank on a machine without the internet (or behind a strict proxy).
Here the page and every asset it loads come from the service itself, at
`/docs/assets/`, open without a key like the page and `/openapi.json`.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

__all__ = ["ASSETS", "install_docs"]

ASSETS = "/docs/assets"
"""Where Swagger UI's files are served (open, like `/docs`)."""


def install_docs(app: FastAPI) -> None:
    """Serve `/docs` (and its OAuth2 redirect) with Swagger UI's assets from the package."""
    app.mount(ASSETS, StaticFiles(directory=swagger_ui_path), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url="/docs/oauth2-redirect",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
            # The validator badge would send the schema to validator.swagger.io.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()
