"""The console over HTTP: who may ask (the access rule), and how every answer is sent.

The access rule (docs/design.md §8), checked in this order on every request:

1. **The body is read or discarded first.** A body of known length up to `MAX_BODY` bytes is
   read and dropped; any other (chunked, longer, an unreadable length) closes the connection
   after the answer. So a kept-alive connection never parses a body as a second request.
2. **Only a Host the console serves**: the address it is bound to, the name given with
   `--host`, `localhost`, and the names given with `--allow-host`. Anything else is 403: a page
   of another site that rebinds its DNS name to this machine's address gets nothing (DNS
   rebinding).
3. **GET and HEAD only**: every other method is 405 (an unknown one 501).
4. **A token**, made at start and printed as part of the URL, in the way Jupyter does: the URL's
   `?token=` sets a cookie (HttpOnly, SameSite=Strict, one name per port) and redirects to the
   same URL without it; every other request must carry the cookie. It is off only when asked
   (`--no-token`), and never on an address outside the loopback range.

Every answer, whatever its status (403, 405, 501, 500 and the stdlib's own 400s included),
carries the same headers: the Content-Security-Policy, nosniff, no referrer, no store.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import secrets
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus, cookies
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit

from sqlalchemy.engine import Engine

from .._errors import ConfigError
from .app import Console, Page

__all__ = ["ConsoleServer", "make_server"]

log = logging.getLogger("autoctx.ui")

#: The largest request body the console reads (and drops) to keep a connection open.
MAX_BODY: Final = 64 * 1024
#: Seconds a connection may sit idle or half-sent before it is closed.
TIMEOUT_S: Final = 30.0
#: Nothing from elsewhere, no script, no framing: the pages are text and images only.
CSP: Final = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_COMMON_HEADERS: Final = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)
_METHODS: Final = ("GET", "HEAD")


def is_loopback(address: str) -> bool:
    """Whether `address` (an IP address as a server is bound to) is in the loopback range."""
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a Host header, without its port, lowercased (`[::1]:80` is `::1`)."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


@dataclass(frozen=True, slots=True)
class Access:
    """Whom the console answers: the Host names it serves and its token (None: no token)."""

    hosts: frozenset[str]
    token: str | None
    cookie: str

    def serves(self, host: str | None) -> bool:
        return host is not None and host_name(host) in self.hosts

    def matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(
            given.encode("utf-8", "surrogateescape"), self.token.encode()
        )

    def cookie_matches(self, header: str | None) -> bool:
        if self.token is None:
            return True
        if not header:
            return False
        jar: cookies.SimpleCookie = cookies.SimpleCookie()
        try:
            jar.load(header)
        except cookies.CookieError:
            return False
        found = jar.get(self.cookie)
        return found is not None and self.matches(found.value)


class ConsoleServer(ThreadingHTTPServer):
    """The console's server: `url` is the address to open (with the token, when there is one)."""

    daemon_threads = True
    access: Access
    url: str
    console: Console

    def server_close(self) -> None:
        super().server_close()
        if hasattr(self, "console"):
            self.console.close()


def _url(address: str, port: int, token: str | None) -> str:
    shown = f"[{address}]" if ":" in address else address
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def make_server(
    engine: Engine,
    tenant: str | None,
    host: str,
    port: int,
    *,
    token: bool = True,
    allow_hosts: Iterable[str] = (),
) -> ConsoleServer:
    """A server for the console, bound but not started (call `serve_forever`).

    With `token` (the default) a new random token guards every page (`server.url` carries it);
    `token=False` is refused unless the bound address is a loopback one. The console answers
    a request whose Host is the bound address, `host` as given, `localhost`, or one of
    `allow_hosts`.
    """
    console = Console(engine, tenant)
    try:
        server = ConsoleServer((host, port), _handler(console))
    except BaseException:
        console.close()
        raise
    server.console = console
    try:
        address, bound_port = str(server.server_address[0]), int(server.server_address[1])
        if not token and not is_loopback(address):
            raise ConfigError(
                f"the console may run without a token only on a loopback address, and {host!r} "
                f"is bound to {address}; drop --no-token (open the URL it prints), or serve on "
                "127.0.0.1"
            )
        names = {host_name(h) for h in (address, host, "localhost", *allow_hosts) if h}
        secret = secrets.token_urlsafe(32) if token else None
        server.access = Access(frozenset(names), secret, f"autoctx-console-{bound_port}")
        server.url = _url(address, bound_port, secret)
    except BaseException:
        server.server_close()
        raise
    return server


def _handler(console: Console) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server: ConsoleServer
        server_version = "autoctx-ui"
        protocol_version = "HTTP/1.1"
        timeout = TIMEOUT_S
        # With Nagle's algorithm on, an answer's last segment after the first answer on a
        # kept-alive connection waited for the client's delayed ACK (40 ms a page on Linux).
        disable_nagle_algorithm = True

        # -- sending ------------------------------------------------------------------------

        def _send(self, page: Page, headers: Mapping[str, str] | None = None) -> None:
            if self.request_version == "HTTP/0.9":
                # An HTTP/0.9 request (or one whose version the server refused) would get a
                # bare body with no status line and no headers: it gets them, and the close.
                self.request_version = self.protocol_version
                self.close_connection = True
            # The status line, the headers and the body in one write (the standard library's
            # `send_response` and `end_headers` write the headers alone, then the body went in a
            # second write): the client woke up for the headers and again for the body, each
            # wake-up a wait for a core on a busy machine.
            self.log_request(page.status)
            phrase = self.responses[page.status][0] if page.status in self.responses else ""
            lines = [
                f"{self.protocol_version} {page.status} {phrase}",
                f"Server: {self.version_string()}",
                f"Date: {self.date_time_string()}",
                f"Content-Type: {page.content_type}",
                f"Content-Length: {len(page.body)}",
            ]
            lines += [
                f"{name}: {value}" for name, value in (*_COMMON_HEADERS, *(headers or {}).items())
            ]
            if self.close_connection:
                lines.append("Connection: close")
            head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "strict")
            self.wfile.write(head + page.body if self.command != "HEAD" else head)

        def send_error(
            self, code: int, message: str | None = None, explain: str | None = None
        ) -> None:
            """The standard library's own refusals (a malformed request line or header, an
            unknown method, ...), as the console's page with its headers; the connection
            closes after it (its body, if any, is never read)."""
            self.close_connection = True
            try:
                status = HTTPStatus(code)
            except ValueError:
                status = HTTPStatus.BAD_REQUEST
            text = {
                HTTPStatus.NOT_IMPLEMENTED: "the console answers GET and HEAD only",
            }.get(status, message or status.description)
            self._send(console.error_page(status, text))

        def _discard_body(self) -> None:
            """Read the request's body and drop it; close the connection after the answer
            when it cannot be read whole (chunked, too long, a bad length)."""
            if self.headers.get("Transfer-Encoding"):
                self.close_connection = True
                return
            length = self.headers.get("Content-Length")
            if length is None:
                return
            try:
                size = int(length)
            except ValueError:
                size = -1
            if not 0 <= size <= MAX_BODY:
                self.close_connection = True
                return
            if size and len(self.rfile.read(size)) < size:
                self.close_connection = True

        # -- answering ----------------------------------------------------------------------

        def _answer(self) -> None:
            self._discard_body()
            access = self.server.access
            if not access.serves(self.headers.get("Host")):
                self._send(
                    console.error_page(
                        HTTPStatus.FORBIDDEN,
                        "this console does not answer that Host name; open it by the address "
                        "`autoctx ui` printed, or start it with --allow-host NAME",
                    )
                )
                return
            if self.command not in _METHODS:
                self._send(
                    console.error_page(
                        HTTPStatus.METHOD_NOT_ALLOWED,
                        "the console is read-only: GET and HEAD only",
                    ),
                    {"Allow": ", ".join(_METHODS)},
                )
                return
            target = urlsplit(self.path)
            query = parse_qsl(target.query, keep_blank_values=True)
            given = [v for k, v in query if k == "token"]
            if given:
                if access.token is not None and not all(access.matches(v) for v in given):
                    self._refuse_token()
                    return
                # Into the cookie, then the same URL without the token (Jupyter's way): the
                # token leaves the address bar, the history and any Referer.
                rest = urlencode([(k, v) for k, v in query if k != "token"])
                # Always a path of this console (`//elsewhere` would leave it).
                here = "/" + target.path.lstrip("/\\")
                headers = {"Location": here + (f"?{rest}" if rest else "")}
                if access.token is not None:
                    headers["Set-Cookie"] = (
                        f"{access.cookie}={access.token}; Path=/; HttpOnly; SameSite=Strict"
                    )
                self._send(
                    console.error_page(HTTPStatus.SEE_OTHER, "signed in: on to the page"), headers
                )
                return
            if not access.cookie_matches(self.headers.get("Cookie")):
                self._refuse_token()
                return
            try:
                page = console.handle(self.path)
            except Exception as exc:
                # The type and the frames only: an error's text may quote SQL, its
                # parameters, or the request's query (search words).
                log.error("console page %s failed (%s)", target.path, type(exc).__name__)
                log.debug("%s", "".join(traceback.format_tb(exc.__traceback__)))
                page = console.error_page(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    "the page failed; the console's log (run with -v) says where",
                )
            self._send(page)

        def _refuse_token(self) -> None:
            self._send(
                console.error_page(
                    HTTPStatus.FORBIDDEN,
                    "this console needs its token: open the URL `autoctx ui` printed (it "
                    "ends in ?token=...)",
                )
            )

        do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = _answer
        do_OPTIONS = do_TRACE = do_CONNECT = _answer

        def log_message(self, format: str, *args: Any) -> None:
            # The method and the path: never the query (a token, search words).
            if log.isEnabledFor(logging.INFO):
                log.info("%s %s", self.command, urlsplit(getattr(self, "path", "")).path)

    return Handler
