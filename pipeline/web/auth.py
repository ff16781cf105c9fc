"""The worker's HTTP authentication: one aiohttp middleware in front of every route.

With ``FRESHKEY_WORKER_WEB_TOKEN`` set, every request but ``GET /freshkey/health`` (and the login page)
must prove it knows the token, one of three ways:

- ``Authorization: Bearer <token>`` (scripts, Prometheus-style scrapers, ``curl``);
- the session cookie a browser gets by logging in once: ``POST /freshkey/login`` with the token (the form
  at ``GET /freshkey/login``), or a link with ``?token=<token>`` (the answer sets the cookie and sends
  the browser on to the same address without the token). The cookie holds an HMAC of the token, not the
  token; it is ``HttpOnly`` and ``SameSite=Strict`` (``Secure`` behind TLS);
- nothing else: a browser asking for a page is sent to the login form, anything else gets 401 with
  ``WWW-Authenticate: Bearer`` and a JSON body that says what to send.

Comparisons take constant time. The token never appears in an answer, a log line or a redirect target.
Without a token the middleware lets everything through (the worker binds 127.0.0.1 by default).
"""

from __future__ import annotations

import hashlib
import hmac
import html
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlsplit

from aiohttp import web

HEALTH_PATH = "/freshkey/health"
LOGIN_PATH = "/freshkey/login"
COOKIE = "freshkey_session"
OPEN_PATHS = frozenset({HEALTH_PATH, LOGIN_PATH})
"""Routes that answer without the token: the health check (it shows no secret) and the login form."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>freshkey worker: log in</title>
<link rel="icon" href="data:,">
<style>body{{font-family:system-ui,sans-serif;margin:4rem auto;max-width:28rem}}
input{{width:100%;padding:.5rem;margin:.5rem 0}}button{{padding:.5rem 1rem}}.err{{color:#b00}}</style>
</head><body><h1>freshkey worker</h1>
<p>This worker's pages need its token (<code>FRESHKEY_WORKER_WEB_TOKEN</code>).</p>{error}
<form method="post" action="{action}"><input type="hidden" name="next" value="{next}">
<label>Token <input type="password" name="token" autocomplete="current-password" autofocus></label>
<button type="submit">Log in</button></form></body></html>
"""


def session_value(token: str) -> str:
    """What the session cookie holds for ``token``: an HMAC, so the cookie does not reveal the token."""
    return hmac.new(token.encode(), b"freshkey worker web session", hashlib.sha256).hexdigest()


def _equal(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def _local_target(target: str | None, default: str = "/dashboard") -> str:
    """A redirect target on this server only (a path), never another site's address."""
    if not target:
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/") or target.startswith("//"):
        return default
    return target


def _wants_html(request: web.Request) -> bool:
    return request.method == "GET" and "text/html" in request.headers.get("Accept", "")


def _login_page(next_path: str, error: str = "", status: int = 200) -> web.Response:
    body = _LOGIN_PAGE.format(
        action=LOGIN_PATH,
        next=html.escape(next_path, quote=True),
        error=f'<p class="err">{html.escape(error)}</p>' if error else "",
    )
    return web.Response(
        text=body,
        content_type="text/html",
        status=status,
        headers={"Cache-Control": "no-store", "WWW-Authenticate": 'Bearer realm="freshkey"'}
        if status == 401
        else {"Cache-Control": "no-store"},
    )


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


def _logged_in(request: web.Request, location: str, session: str) -> web.Response:
    response = _see_other(location)
    response.set_cookie(COOKIE, session, httponly=True, samesite="Strict", secure=request.secure, path="/")
    return response


def auth_middleware(token: str | None) -> Any:
    """The middleware for ``web_application_options={"middlewares": [...]}`` (Faust's aiohttp driver);
    ``token`` None: no authentication."""
    session = session_value(token) if token is not None else ""

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token is None:
            return await handler(request)
        path = request.path
        if path == LOGIN_PATH:
            return await _login(request, token, session)
        if path in OPEN_PATHS:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, credential = header.partition(" ")
        if scheme.lower() == "bearer" and _equal(credential.strip(), token):
            return await handler(request)
        if _equal(request.cookies.get(COOKIE, ""), session):
            return await handler(request)
        given = request.query.get("token")
        if given is not None and request.method == "GET" and _equal(given, token):
            # A link with the token: keep a session and send the browser on without it in the address.
            return _logged_in(request, str(request.rel_url.without_query_params("token")), session)
        if _wants_html(request):
            return _see_other(
                f"{LOGIN_PATH}?next={quote(str(request.rel_url.without_query_params('token')))}"
            )
        return web.json_response(
            {
                "error": "this worker needs its token: send 'Authorization: Bearer "
                f"<FRESHKEY_WORKER_WEB_TOKEN>' (browsers: log in at {LOGIN_PATH})"
            },
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="freshkey"'},
        )

    return authenticate


async def _login(request: web.Request, token: str, session: str) -> web.StreamResponse:
    if request.method == "GET":
        return _login_page(_local_target(request.query.get("next")))
    if request.method != "POST":
        return web.json_response({"error": "GET or POST"}, status=405, headers={"Allow": "GET, POST"})
    form = await request.post()
    next_path = _local_target(str(form.get("next") or ""))
    if _equal(str(form.get("token") or ""), token):
        return _logged_in(request, next_path, session)
    return _login_page(next_path, "That is not this worker's token.", status=401)
