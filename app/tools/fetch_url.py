"""The `fetch_url` built-in tool: read a web page (or a text file on the web) for the model.

A model chooses the URL, so every request is treated as hostile input:

- only http:// and https:// (no file:, ftp:, data:, gopher:);
- the host is resolved here and EVERY address it resolves to is checked: loopback, private
  (RFC 1918, fc00::/7), link-local (169.254/16 holds the cloud metadata service), multicast,
  reserved and unspecified addresses are refused unless the user allowed them in Settings. The
  connection then goes to the address that was checked (the socket connects to that IP, the Host
  header and TLS name stay the host's), so a DNS answer that changes between the check and the
  connection (DNS rebinding) cannot lead it elsewhere;
- redirects are followed by hand, at most MAX_REDIRECTS, and each hop goes through the same
  checks (a public page redirecting to http://127.0.0.1/ is refused like the direct URL);
- one deadline for the whole fetch (every hop, every read), so a server trickling one byte a
  second cannot hold the tool for longer than TIME_LIMIT_S;
- at most MAX_BYTES of body are read; a larger body is refused (Content-Length says so before
  anything is read, or reading stops at the limit) rather than cut in the middle of a page;
- HTML becomes readable text (app/tools/html_text.py); text/* , JSON and XML are passed on as
  text; anything else (images, PDF, archives) is refused by its type. The text handed to the
  model is capped at MAX_TEXT_CHARS with a note saying how much was left out, since a page
  can hold more words than a small model's context.

Failures raise FetchError subclasses; run_builtin turns them into an error result the model
reads ("Error: ..."), the same as any other tool's refusal.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from app.tools.errors import ToolArgumentsError, ToolError
from app.tools.html_text import html_to_text
from engine.cancel import CancelToken

MAX_BYTES = 2 * 2**20  # 2 MiB: far more than a readable page, far less than a video
TIME_LIMIT_S = 20.0  # the whole fetch, redirects included
MAX_REDIRECTS = 5
MAX_TEXT_CHARS = 20_000  # about 5,000 tokens: what a page can take of a small model's context
MAX_URL_CHARS = 2_048
READ_CHUNK = 64 * 1024
USER_AGENT = "LocalChat-fetch_url/1.0 (+a local chat app; one page, on a user's request)"
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
HTML_TYPES = ("text/html", "application/xhtml+xml")
TEXT_TYPES = ("application/json", "application/xml", "application/javascript")


class FetchError(ToolError):
    """The page could not be fetched; the message says why, for the user and the model."""


class FetchRefused(FetchError):
    """The URL is not allowed: its scheme, or an address it resolves to (private, loopback...)."""


class FetchTimeout(FetchError):
    """The server did not answer (or finish sending) within the time limit."""


class FetchTooLarge(FetchError):
    """The body is larger than MAX_BYTES."""


class FetchUnsupportedType(FetchError):
    """The body is not text (an image, a PDF, an archive...)."""


class FetchHttpError(FetchError):
    """The server answered with an error status (4xx, 5xx) or a redirect without a target."""


@dataclass(frozen=True)
class FetchLimits:
    max_bytes: int = MAX_BYTES
    time_limit_s: float = TIME_LIMIT_S
    max_redirects: int = MAX_REDIRECTS
    max_text_chars: int = MAX_TEXT_CHARS


@dataclass(frozen=True)
class FetchedPage:
    url: str  # the final URL, after redirects
    status: int
    content_type: str
    text: str  # readable text (HTML) or the text itself
    title: str
    n_bytes: int
    redirects: tuple[str, ...]  # the URLs that redirected, in order
    truncated_chars: int  # characters of text left out past max_text_chars


def fetch_url(
    url: str,
    *,
    allow_private: bool = False,
    limits: FetchLimits = FetchLimits(),
    cancel: CancelToken | None = None,
) -> FetchedPage:
    """Fetch `url` under the rules in the module docstring; FetchError says what went wrong."""
    if not isinstance(url, str) or not url.strip():
        raise ToolArgumentsError('fetch_url needs a "url" string, such as https://example.com/')
    url = url.strip()
    if len(url) > MAX_URL_CHARS:
        raise ToolArgumentsError(f"the URL is {len(url)} characters long (limit {MAX_URL_CHARS})")
    deadline = time.monotonic() + limits.time_limit_s
    redirects: list[str] = []
    current = url
    while True:
        _check_cancel(cancel)
        target = _parse(current)
        address = _checked_address(target, allow_private, deadline, limits)
        status, headers, body = _request(target, address, deadline, limits, cancel)
        if status in REDIRECT_STATUSES:
            location = headers.get("location")
            if not location:
                raise FetchHttpError(f"{current} answered {status} (a redirect) with no Location")
            if len(redirects) >= limits.max_redirects:
                raise FetchHttpError(
                    f"{url} redirected more than {limits.max_redirects} times "
                    f"(last: {current} -> {location}); not followed further"
                )
            redirects.append(current)
            current = urljoin(current, location)
            continue
        if status >= 400:
            raise FetchHttpError(
                f"{current} answered {status} {headers.get(':reason', '')}".strip()
            )
        return _page(current, status, headers, body, tuple(redirects), limits)


def format_page(page: FetchedPage) -> str:
    """What the model reads: where the text came from, then the text."""
    lines = [f"URL: {page.url}"]
    if page.redirects:
        lines.append(f"(redirected from {page.redirects[0]})")
    if page.title:
        lines.append(f"Title: {page.title}")
    lines.append(f"Content-Type: {page.content_type}")
    lines.append("")
    lines.append(page.text if page.text.strip() else "(the page has no readable text)")
    if page.truncated_chars:
        lines.append(
            f"\n[{page.truncated_chars:,} more characters of this page were left out: "
            f"the tool returns at most {len(page.text):,}.]"
        )
    return "\n".join(lines)


# --- one hop -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Target:
    url: str
    scheme: str
    host: str
    port: int
    path: str  # path and query, as sent in the request line


def _parse(url: str) -> _Target:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ToolArgumentsError(f"{url!r} is not a usable URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        shown = f"{scheme}:" if scheme else "no scheme"
        raise FetchRefused(f"{url!r} uses {shown}; fetch_url reads only http:// and https:// URLs")
    host = parts.hostname
    if not host:
        raise ToolArgumentsError(f"{url!r} has no host name")
    if any(c in url for c in "\r\n\t "):
        raise ToolArgumentsError(f"{url!r} contains spaces or line breaks")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return _Target(url, scheme, host, port or (443 if scheme == "https" else 80), path)


def _checked_address(target: _Target, allow_private: bool, deadline: float, limits) -> str:
    """The address to connect to, after checking every address the host resolves to."""
    try:
        literal = ipaddress.ip_address(target.host)
        addresses = [str(literal)]
    except ValueError:
        # getaddrinfo has no timeout of its own; it runs here on the tool's thread, and the
        # deadline is checked right after it.
        try:
            infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise FetchError(f"the host {target.host!r} could not be resolved ({exc})") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    _check_deadline(deadline, target, limits)
    if not addresses:
        raise FetchError(f"the host {target.host!r} has no address")
    if not allow_private:
        for address in addresses:
            why = non_public_reason(address)
            if why is not None:
                shown = target.host if target.host == address else f"{target.host} ({address})"
                raise FetchRefused(
                    f"{shown} is {why}; fetch_url does not reach such addresses unless "
                    "the user allows it (Settings > Let fetch_url reach local and private "
                    "network addresses)"
                )
    return addresses[0]


def non_public_reason(address: str) -> str | None:
    """Why an address is not on the public internet ('a loopback address'...), or None."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone (fe80::1%eth0)
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or ip.sixtofour
        if mapped is not None:  # ::ffff:127.0.0.1 is 127.0.0.1
            ip = mapped
    if ip.is_loopback:
        return "a loopback address (this computer)"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_private:
        return "a private network address"
    if ip.is_reserved or not ip.is_global:
        return "a reserved address"
    return None


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to the checked address; the Host header still names the host."""

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """Connects to the checked address; the certificate is verified against the host name."""

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]


def _request(target: _Target, address: str, deadline: float, limits, cancel):
    """(status, lower-cased headers with ':reason', body bytes) of one GET, no redirects."""
    remaining = _check_deadline(deadline, target, limits)
    kind = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
    conn = kind(target.host, target.port, address, timeout=remaining)
    # Socket timeouts bound each read, not the whole: a server sending a header line every
    # second would never time one out. The watchdog shuts the socket at the deadline.
    watchdog = _Watchdog(conn, remaining)
    try:
        try:
            conn.request(
                "GET",
                target.path,
                headers={
                    "User-Agent": USER_AGENT,
                    "Accept": "text/html,application/xhtml+xml,text/*;q=0.9,*/*;q=0.5",
                    "Accept-Encoding": "identity",  # a compressed body would dodge MAX_BYTES
                    "Connection": "close",
                },
            )
            _set_timeout(conn, deadline, target, limits)
            response = conn.getresponse()
        except TimeoutError:
            raise _timeout(target, limits) from None
        except (OSError, http.client.HTTPException) as exc:
            if watchdog.fired:
                raise _timeout(target, limits) from None
            if isinstance(exc, ssl.SSLError):
                raise FetchError(f"{target.url}: the secure connection failed ({exc})") from None
            raise FetchError(f"{target.url} could not be reached ({exc})") from None
        headers = {k.lower(): v for k, v in response.getheaders()}
        headers[":reason"] = response.reason or ""
        if response.status in REDIRECT_STATUSES or response.status >= 400:
            return response.status, headers, b""
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise FetchUnsupportedType(
                f"{target.url} sent a {encoding}-compressed body though none was asked for"
            )
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limits.max_bytes:
            raise FetchTooLarge(
                f"{target.url} is {_size(int(length))}; fetch_url reads at most "
                f"{_size(limits.max_bytes)}"
            )
        body = bytearray()
        while True:
            _check_cancel(cancel)
            _set_timeout(conn, deadline, target, limits)
            try:
                chunk = response.read1(READ_CHUNK)
            except TimeoutError:
                raise _timeout(target, limits) from None
            except (OSError, http.client.HTTPException, ValueError) as exc:
                # ValueError: http.client reading a socket the watchdog closed
                if watchdog.fired:
                    raise _timeout(target, limits) from None
                raise FetchError(f"{target.url}: the transfer broke off ({exc})") from None
            if watchdog.fired:
                raise _timeout(target, limits)
            if not chunk:
                break
            body += chunk
            if len(body) > limits.max_bytes:
                raise FetchTooLarge(
                    f"{target.url} is larger than {_size(limits.max_bytes)} "
                    "(the limit fetch_url reads); reading stopped there"
                )
        return response.status, headers, bytes(body)
    finally:
        watchdog.stop()
        conn.close()


class _Watchdog:
    """Shuts a connection's socket when its time is up, from a timer thread."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float):
        self.fired = False
        self._conn = conn
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked recv; close() alone may not

    def stop(self) -> None:
        self._timer.cancel()


def _set_timeout(conn, deadline: float, target: _Target, limits) -> None:
    remaining = _check_deadline(deadline, target, limits)
    if conn.sock is not None:
        conn.sock.settimeout(remaining)


def _check_deadline(deadline: float, target: _Target, limits) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _timeout(target, limits)
    return remaining


def _timeout(target: _Target, limits) -> FetchTimeout:
    return FetchTimeout(
        f"{target.url} did not finish answering within {limits.time_limit_s:g} seconds "
        "(the time limit of fetch_url)"
    )


def _check_cancel(cancel: CancelToken | None) -> None:
    if cancel is not None and cancel.cancelled:
        raise FetchError("the fetch was stopped")


# --- the body ----------------------------------------------------------------------------------
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_\-:.]+)""", re.I)


def _page(url, status, headers, body: bytes, redirects, limits: FetchLimits) -> FetchedPage:
    content_type = headers.get("content-type", "").strip()
    mime = content_type.split(";", 1)[0].strip().lower() or _sniff(body)
    is_html = mime in HTML_TYPES
    if not (is_html or mime.startswith("text/") or mime in TEXT_TYPES or mime.endswith("+json")):
        raise FetchUnsupportedType(
            f"{url} is {mime} ({_size(len(body))}), not a web page or text; "
            "fetch_url reads HTML and text only"
        )
    charset = _charset(content_type, body if is_html else b"")
    try:
        text = body.decode(charset, errors="replace")
    except LookupError:  # a charset Python does not know: UTF-8 is the web's usual one
        text = body.decode("utf-8", errors="replace")
    title = ""
    if is_html:
        title, text = html_to_text(text)
    text = text.strip()
    cut = max(0, len(text) - limits.max_text_chars)
    if cut:
        text = text[: limits.max_text_chars]
    return FetchedPage(url, status, mime, text, title, len(body), redirects, cut)


def _charset(content_type: str, html: bytes) -> str:
    match = re.search(r"charset\s*=\s*[\"']?([A-Za-z0-9_\-:.]+)", content_type, re.I)
    if match:
        return match.group(1)
    meta = _META_CHARSET.search(html[:4096])
    return meta.group(1).decode("ascii") if meta else "utf-8"


def _sniff(body: bytes) -> str:
    """A type for a body sent without Content-Type: HTML if it starts like HTML, else unknown."""
    head = body[:512].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html")):
        return "text/html"
    return "application/octet-stream"


def _size(n: int) -> str:
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    if n >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{n} bytes"
