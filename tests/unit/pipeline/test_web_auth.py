"""The worker's HTTP authentication middleware, on a real aiohttp server (no worker behind it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer

from pipeline.web.auth import COOKIE, HEALTH_PATH, LOGIN_PATH, auth_middleware, session_value
from pipeline.web.settings import WebSettings

TOKEN = "0123456789abcdef-worker-token"

Scenario = Callable[[TestClient[Any, Any], list[ClientResponse]], Awaitable[None]]


def _app(token: str | None) -> web.Application:
    app = web.Application(middlewares=[auth_middleware(token)])

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"path": request.path})

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<html>dashboard</html>", content_type="text/html")

    app.router.add_get("/freshkey/stats", ok)
    app.router.add_get(HEALTH_PATH, ok)
    app.router.add_get("/dashboard", page)
    return app


def _run(token: str | None, scenario: Scenario) -> list[ClientResponse]:
    """Run ``scenario`` against a server; returns every response it recorded (bodies read)."""
    seen: list[ClientResponse] = []

    async def main() -> None:
        async with TestClient(TestServer(_app(token))) as client:
            await scenario(client, seen)

    asyncio.run(main())
    return seen


async def _get(
    client: TestClient[Any, Any], seen: list[ClientResponse], path: str, **kw: Any
) -> ClientResponse:
    response = await client.get(path, allow_redirects=False, **kw)
    await response.read()
    seen.append(response)
    return response


def _no_token_anywhere(responses: list[ClientResponse]) -> None:
    for response in responses:
        assert TOKEN not in response.headers.get("Location", "")
        assert TOKEN not in response.headers.get("Set-Cookie", "")
        assert TOKEN.encode() not in (response._body or b"")  # read above


def test_without_a_token_everything_answers() -> None:
    async def scenario(client: TestClient[Any, Any], seen: list[ClientResponse]) -> None:
        assert (await _get(client, seen, "/freshkey/stats")).status == 200

    _run(None, scenario)


def test_api_needs_the_bearer_token() -> None:
    async def scenario(client: TestClient[Any, Any], seen: list[ClientResponse]) -> None:
        missing = await _get(client, seen, "/freshkey/stats")
        assert missing.status == 401
        assert missing.headers["WWW-Authenticate"].startswith("Bearer")
        assert "Authorization: Bearer" in (await missing.json())["error"]
        wrong = await _get(client, seen, "/freshkey/stats", headers={"Authorization": "Bearer nope"})
        assert wrong.status == 401
        right = await _get(client, seen, "/freshkey/stats", headers={"Authorization": f"Bearer {TOKEN}"})
        assert right.status == 200
        health = await _get(client, seen, HEALTH_PATH)
        assert health.status == 200  # no token for the health check

    _no_token_anywhere(_run(TOKEN, scenario))


def test_a_link_with_the_token_logs_a_browser_in() -> None:
    async def scenario(client: TestClient[Any, Any], seen: list[ClientResponse]) -> None:
        first = await _get(client, seen, f"/dashboard?token={TOKEN}&theme=dark")
        assert first.status == 303
        assert first.headers["Location"] == "/dashboard?theme=dark"  # the token left the address
        cookie = first.cookies[COOKIE]
        assert cookie.value == session_value(TOKEN) != TOKEN
        assert cookie["httponly"] and cookie["samesite"] == "Strict"
        again = await _get(client, seen, "/dashboard?theme=dark")  # the client keeps the cookie
        assert again.status == 200
        assert (await _get(client, seen, "/freshkey/stats")).status == 200

    _no_token_anywhere(_run(TOKEN, scenario))


def test_the_login_form_logs_a_browser_in() -> None:
    async def scenario(client: TestClient[Any, Any], seen: list[ClientResponse]) -> None:
        page = await _get(client, seen, "/dashboard", headers={"Accept": "text/html"})
        assert page.status == 303
        assert page.headers["Location"] == f"{LOGIN_PATH}?next=/dashboard"
        form = await _get(client, seen, page.headers["Location"])
        assert form.status == 200 and b'name="token"' in (form._body or b"")
        refused = await client.post(LOGIN_PATH, data={"token": "wrong", "next": "/dashboard"})
        assert refused.status == 401
        assert (await _get(client, seen, "/freshkey/stats")).status == 401
        accepted = await client.post(
            LOGIN_PATH, data={"token": TOKEN, "next": "/dashboard"}, allow_redirects=False
        )
        assert accepted.status == 303 and accepted.headers["Location"] == "/dashboard"
        assert (await _get(client, seen, "/dashboard")).status == 200
        assert (await _get(client, seen, "/freshkey/stats")).status == 200

    _no_token_anywhere(_run(TOKEN, scenario))


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/x", "javascript:alert(1)"])
def test_login_never_redirects_off_the_server(target: str) -> None:
    async def scenario(client: TestClient[Any, Any], seen: list[ClientResponse]) -> None:
        accepted = await client.post(LOGIN_PATH, data={"token": TOKEN, "next": target}, allow_redirects=False)
        assert accepted.headers["Location"] == "/dashboard"

    _run(TOKEN, scenario)


def test_a_forged_cookie_is_refused() -> None:
    async def scenario(client: TestClient[Any, Any], seen: list[ClientResponse]) -> None:
        client.session.cookie_jar.update_cookies({COOKIE: session_value("another token of 16+")})
        assert (await _get(client, seen, "/freshkey/stats")).status == 401

    _run(TOKEN, scenario)


def test_token_settings() -> None:
    assert WebSettings(web_token="").web_token is None  # FRESHKEY_WORKER_WEB_TOKEN= (empty): none
    with pytest.raises(ValueError, match="16 characters"):
        WebSettings(web_token="short")
    settings = WebSettings(web_token=TOKEN)
    assert TOKEN not in repr(settings)
    assert settings.faust_pages is False and settings.web_show_values is False
