"""`/docs` renders Swagger UI in a real headless browser with nothing loaded from
elsewhere: every asset comes from the service (the installed `fastapi-offline`).

The browser is Debian's chromium (`.ci/run` installs it). Without it the test is
skipped, except under `CI=true`, where it fails loudly.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.service.agents import weather_agent
from tests.service.conftest import Server

CHROMIUM = Path("/usr/bin/chromium")


def _browser() -> Path:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: `apt-get install -y chromium chromium-driver`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " (CI=true: the browser test must run)")
        pytest.skip(message)
    return CHROMIUM


@pytest.mark.parametrize("backend", ["sqlite"])  # the page reads no database
def test_docs_render_with_no_request_leaving_the_machine(
    serve: Callable[..., Server],
) -> None:
    from playwright.sync_api import Route, sync_playwright

    executable = _browser()
    server = serve(weather_agent())
    local: list[str] = []
    outside: list[str] = []

    def route(request: Route) -> None:
        url = request.request.url
        if urlsplit(url).hostname == "127.0.0.1":
            local.append(url)
            request.continue_()
        else:
            outside.append(url)
            request.abort()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(executable), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.route("**/*", route)
            page.goto(f"{server.url}/docs")
            page.wait_for_selector(".opblock-summary-path", timeout=60_000)
            shown = page.locator(".opblock-summary-path").all_inner_texts()
        finally:
            browser.close()
    assert outside == []
    assert any(url.endswith("/openapi.json") for url in local)
    assert any("/docs/assets/swagger-ui-bundle.js" in url for url in local)
    assert {"/v1/ask", "/v1/conversations", "/v1/runs/{run_id}", "/healthz"} <= {
        s.replace("\u200b", "") for s in shown
    }
