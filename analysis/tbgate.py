"""A TensorBoard only its owner can open: `TokenGate`, a WSGI layer in front of TensorBoard's app. On a
cluster's login node every user shares 127.0.0.1, so a server there is anyone's; like Jupyter's, this one
prints a URL carrying a random token. The first request with it (`?token=...`) gets the token as a
cookie (HttpOnly, SameSite=Strict, its Path the server's own random path prefix: a browser sends a
cookie of 127.0.0.1 to every port of the host, and only the path keeps it from another user's server
there) and is sent on to the same page without it; every
later request (the pages' own XHRs, the trace viewer's iframe) carries the cookie. Any request with
neither is refused (403) with one line and nothing of the runs. The token is compared in constant
time. Written here rather than taken from a library because TensorBoard has no authentication of its
own and werkzeug gives only the request and response types this uses. No torch import.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode

TOKEN_BYTES = 24
REFUSED = b"403: this TensorBoard is its owner's: open the URL it printed when it started (it carries a token)\n"

StartResponse = Callable[..., Any]
App = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


class TokenGate:
    """`app` behind `token`: see the module doc. `port` names the cookie, so that two TensorBoards on one
    host (different ports, one browser) do not take each other's; `prefix` (the app's path prefix, '/x')
    is the cookie's path."""

    def __init__(self, app: App, token: str, port: int, prefix: str = ""):
        self.app = app
        self.token = token
        self.cookie = f"hpc_tb_{port}"
        self.path = prefix.rstrip("/") + "/"

    def _holds(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        query = dict(parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True))
        if self._holds(query.get("token")):
            rest = urlencode([(k, v) for k, v in query.items() if k != "token"])
            where = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "/") + (f"?{rest}" if rest else "")
            start_response(
                "302 Found",
                [
                    ("Location", where or "/"),
                    ("Set-Cookie", self._set_cookie()),
                    ("Cache-Control", "no-store"),
                    ("Content-Length", "0"),
                ],
            )
            return [b""]
        if self._holds(self._cookie(environ.get("HTTP_COOKIE", ""))):
            return self.app(environ, start_response)
        headers = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(REFUSED)))]
        start_response("403 Forbidden", [*headers, ("Cache-Control", "no-store")])
        return [REFUSED]

    def _set_cookie(self) -> str:
        return f"{self.cookie}={self.token}; Path={self.path}; HttpOnly; SameSite=Strict"

    def _cookie(self, header: str) -> str | None:
        for part in header.split(";"):
            name, eq, value = part.strip().partition("=")
            if eq and name == self.cookie:
                return value
        return None
