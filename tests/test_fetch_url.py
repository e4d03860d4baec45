"""The fetch_url tool against a real HTTP server on 127.0.0.1 (http.server in a thread).

Loopback is refused by default, so the tests that read pages pass allow_private=True
explicitly, and one test shows the default refusing the same server. Limits are shortened
(FetchLimits) so the oversize and slow-server cases take a fraction of a second.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.tools import fetch_url as fetch_module
from app.tools.builtin import BUILTIN_TOOLS, ToolContext, builtin_needs_approval, run_builtin
from app.tools.errors import ToolArgumentsError
from app.tools.fetch_url import (
    FetchError,
    FetchHttpError,
    FetchLimits,
    FetchRefused,
    FetchTimeout,
    FetchTooLarge,
    FetchUnsupportedType,
    fetch_url,
    format_page,
    non_public_reason,
)
from app.tools.html_text import html_to_text
from engine.cancel import CancelToken

PAGE = b"""<!doctype html><html><head><title>The  Test Page</title>
<style>body { color: red }</style><script>var secret = "not text";</script></head>
<body><nav>Home | About</nav><h1>Opening hours</h1><p>We open at <b>9</b> and close at 17.</p>
<ul><li>Monday<li>Tuesday</ul><footer>Copyright</footer></body></html>"""


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass

    def do_GET(self):
        routes = {
            "/page": self._page,
            "/text": self._text,
            "/image": self._image,
            "/big": self._big,
            "/big-unsized": self._big_unsized,
            "/slow": self._slow,
            "/slow-headers": self._slow_headers,
            "/loop": self._loop,
            "/hop": self._hop,
            "/missing": self._missing,
            "/latin1": self._latin1,
        }
        routes.get(self.path.split("?")[0], self._missing)()

    def _send(self, status, content_type, body, extra=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _page(self):
        self._send(200, "text/html; charset=utf-8", PAGE)

    def _text(self):
        self._send(200, "text/plain; charset=utf-8", "plain café text\n".encode())

    def _latin1(self):
        self._send(200, "text/plain; charset=iso-8859-1", "café".encode("latin-1"))

    def _image(self):
        self._send(200, "image/png", b"\x89PNG\r\n\x1a\n" + b"\0" * 100)

    def _big(self):
        self._send(200, "text/plain", b"x" * (self.server.limit + 1))

    def _big_unsized(self):
        # No Content-Length: the limit has to be found while reading
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for _ in range(40):
                self.wfile.write(b"y" * 1024)
        except OSError:
            pass  # the client stopped reading at its limit

    def _slow(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "1000")
        self.end_headers()
        try:
            while not self.server.stop.is_set():  # a byte at a time, never finishing
                self.wfile.write(b"z")
                self.wfile.flush()
                self.server.stop.wait(0.05)
        except OSError:
            pass

    def _slow_headers(self):
        # Each header line comes well within a socket timeout, so only a deadline stops it
        try:
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            for i in range(10_000):
                if self.server.stop.wait(0.05):
                    return
                self.wfile.write(f"X-Trickle-{i}: 1\r\n".encode())
                self.wfile.flush()
        except OSError:
            pass

    def _loop(self):
        self._send(302, "text/plain", b"", [("Location", "/loop")])

    def _hop(self):
        n = int(self.path.split("n=")[1]) if "n=" in self.path else 0
        target = f"/hop?n={n + 1}" if n < 3 else "/page"
        self._send(301, "text/plain", b"", [("Location", target)])

    def _missing(self):
        self._send(404, "text/plain", b"no such page")


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.limit = 4096
    httpd.stop = threading.Event()
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", httpd
    finally:
        httpd.stop.set()
        httpd.shutdown()
        httpd.server_close()


def test_html_page_becomes_readable_text(server):
    base, _ = server
    page = fetch_url(f"{base}/page", allow_private=True)
    assert page.status == 200 and page.content_type == "text/html"
    assert page.title == "The Test Page"
    assert page.text == "# Opening hours\n\nWe open at 9 and close at 17.\n\n- Monday\n- Tuesday"
    # what is never shown, and the furniture every page repeats, is left out
    for hidden in ("secret", "color: red", "Home | About", "Copyright"):
        assert hidden not in page.text
    shown = format_page(page)
    assert shown.startswith(f"URL: {base}/page\nTitle: The Test Page\nContent-Type: text/html\n")


def test_loopback_is_refused_by_default(server):
    base, _ = server
    with pytest.raises(FetchRefused, match="loopback"):
        fetch_url(f"{base}/page")
    # and through the tool, as an error result the model can read
    result = run_builtin("fetch_url", {"url": f"{base}/page"})
    assert result.is_error and "loopback" in result.text and "Settings" in result.text


def test_the_setting_lets_the_tool_reach_loopback(server):
    base, _ = server
    result = run_builtin(
        "fetch_url", {"url": f"{base}/text"}, ToolContext(allow_private_addresses=True)
    )
    assert not result.is_error, result.text
    assert result.text.endswith("plain café text")


def test_plain_text_is_passed_on_and_its_charset_honoured(server):
    base, _ = server
    assert fetch_url(f"{base}/text", allow_private=True).text == "plain café text"
    assert fetch_url(f"{base}/latin1", allow_private=True).text == "café"


def test_a_non_text_type_is_refused_by_its_type(server):
    base, _ = server
    with pytest.raises(FetchUnsupportedType, match="image/png"):
        fetch_url(f"{base}/image", allow_private=True)


def test_redirects_are_followed_up_to_the_cap(server):
    base, _ = server
    page = fetch_url(f"{base}/hop", allow_private=True)  # 4 redirects, then the page
    assert page.url == f"{base}/page" and page.title == "The Test Page"
    assert page.redirects == (
        f"{base}/hop",
        f"{base}/hop?n=1",
        f"{base}/hop?n=2",
        f"{base}/hop?n=3",
    )
    with pytest.raises(FetchHttpError, match="redirected more than 3 times"):
        fetch_url(f"{base}/hop", allow_private=True, limits=FetchLimits(max_redirects=3))


def test_a_redirect_loop_ends_at_the_cap(server):
    base, _ = server
    with pytest.raises(FetchHttpError, match="redirected more than 5 times"):
        fetch_url(f"{base}/loop", allow_private=True)


def test_each_redirect_hop_is_checked_again(server, monkeypatch):
    """A public page that redirects to a loopback address is refused at that hop."""
    base, _ = server
    public = "93.184.215.14"  # a public address, never contacted: the test answers for it
    calls = []

    def fake_request(target, address, deadline, limits, cancel):
        calls.append(address)
        return 302, {"location": f"{base}/page", ":reason": "Found"}, b""

    monkeypatch.setattr(fetch_module, "_request", fake_request)
    with pytest.raises(FetchRefused, match="loopback"):
        fetch_url(f"http://{public}/start")
    assert calls == [public]  # the first hop went out; the loopback hop never did


def test_every_resolved_address_is_checked(monkeypatch):
    """DNS rebinding: a name that resolves to a public AND a private address is refused."""
    infos = [
        (2, 1, 6, "", ("93.184.215.14", 80)),
        (2, 1, 6, "", ("10.0.0.5", 80)),
    ]
    monkeypatch.setattr(fetch_module.socket, "getaddrinfo", lambda *a, **k: infos)
    with pytest.raises(FetchRefused, match=r"rebind\.example \(10\.0\.0\.5\) is a private"):
        fetch_url("http://rebind.example/")


def test_the_connection_goes_to_the_checked_address(server, monkeypatch):
    """The socket connects to the address that was checked, not to a second lookup."""
    base, _ = server
    port = int(base.rsplit(":", 1)[1])
    monkeypatch.setattr(
        fetch_module.socket,
        "getaddrinfo",
        lambda *a, **k: [(2, 1, 6, "", ("127.0.0.1", port))],
    )
    page = fetch_url(f"http://only-resolved-here.invalid:{port}/text", allow_private=True)
    assert page.text == "plain café text"


def test_an_oversize_body_is_refused(server):
    base, httpd = server
    limits = FetchLimits(max_bytes=httpd.limit)
    with pytest.raises(FetchTooLarge, match="4 KiB"):  # said by Content-Length, nothing read
        fetch_url(f"{base}/big", allow_private=True, limits=limits)
    with pytest.raises(FetchTooLarge, match="reading stopped"):  # no length: found by reading
        fetch_url(f"{base}/big-unsized", allow_private=True, limits=limits)


def test_a_slow_body_times_out(server):
    base, _ = server
    start = time.monotonic()
    with pytest.raises(FetchTimeout, match="within 0.5 seconds"):
        fetch_url(f"{base}/slow", allow_private=True, limits=FetchLimits(time_limit_s=0.5))
    assert time.monotonic() - start < 10  # not the server's pace: it never finishes


def test_headers_trickling_in_still_time_out(server):
    base, _ = server
    with pytest.raises(FetchTimeout):
        fetch_url(f"{base}/slow-headers", allow_private=True, limits=FetchLimits(time_limit_s=0.5))


def test_an_http_error_status_is_an_error(server):
    base, _ = server
    with pytest.raises(FetchHttpError, match="404"):
        fetch_url(f"{base}/missing", allow_private=True)


def test_stop_cancels_a_fetch(server):
    base, _ = server
    token = CancelToken()
    token.cancel()
    with pytest.raises(FetchError, match="stopped"):
        fetch_url(f"{base}/page", allow_private=True, cancel=token)


def test_long_text_is_capped_with_a_note(server):
    base, _ = server
    page = fetch_url(f"{base}/text", allow_private=True, limits=FetchLimits(max_text_chars=5))
    assert page.text == "plain" and page.truncated_chars == len(" café text")
    assert "[10 more characters of this page were left out" in format_page(page)


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("file:///etc/passwd", FetchRefused),
        ("ftp://example.com/x", FetchRefused),
        ("javascript:alert(1)", FetchRefused),
        ("example.com/no-scheme", FetchRefused),
        ("http:///no-host", ToolArgumentsError),
        ("", ToolArgumentsError),
        ("http://example.com:99999/", ToolArgumentsError),
    ],
)
def test_urls_that_are_not_http_are_refused(url, error):
    with pytest.raises(error):
        fetch_url(url)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped IPv6
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link-local"),  # cloud metadata service
        ("fe80::1%eth0", "link-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("100.64.0.1", "reserved"),  # carrier-grade NAT
        ("93.184.215.14", None),
        ("2606:4700::6810:84e5", None),
    ],
)
def test_non_public_addresses(address, reason):
    why = non_public_reason(address)
    assert (why is None) if reason is None else (reason in why)


def test_fetch_url_is_registered_and_asks_first():
    assert "fetch_url" in BUILTIN_TOOLS
    assert builtin_needs_approval("fetch_url")
    assert not builtin_needs_approval("calculator")
    result = run_builtin("fetch_url", {})
    assert result.is_error and '"url"' in result.text


def test_html_text_survives_broken_markup():
    title, text = html_to_text("<p>one<div hidden>gone<p>still gone</div><p>two <i>three")
    assert title == "" and text == "one\ntwo three"


# --- in the window: the approval flow and the setting ------------------------------------------
def _tool_widgets(window):
    from engine.types import Role

    return [w for w in window.chat_view.widgets if w.message.role == Role.TOOL]


def _fetch_in_window(qtbot, tmp_path, url, allow_private):
    from app_fakes import WAIT_MS, FakeEngine, ToolCallReply, make_window

    from app.tool_registry import builtin_key

    engine = FakeEngine(replies=[ToolCallReply(calls=(("fetch_url", {"url": url}),)), "Done."])
    window = make_window(qtbot, tmp_path, engine)
    window.settings.fetch_allow_private = allow_private
    window.session.set_tool_enabled(builtin_key("fetch_url"), True)
    assert window.session.send("What are the opening hours?")
    qtbot.waitUntil(lambda: bool(_tool_widgets(window)), timeout=WAIT_MS)
    widget = _tool_widgets(window)[0]
    qtbot.waitUntil(widget.approval_row.isVisible, timeout=WAIT_MS)
    assert len(engine.requests) == 1  # nothing fetched before the user answers
    widget.allow_once_button.click()
    qtbot.waitUntil(lambda: len(engine.requests) == 2 and not window.session.busy, timeout=WAIT_MS)
    return window, engine, widget


def test_window_asks_before_fetching_then_the_model_reads_the_page(qtbot, tmp_path, server):
    from app_fakes import close_window

    from engine.types import ToolApproval

    base, _ = server
    window, engine, widget = _fetch_in_window(qtbot, tmp_path, f"{base}/page", True)
    try:
        assert widget.message.tool["approval"] == ToolApproval.ONCE
        sent = engine.requests[1].messages[-1]["content"]
        assert "# Opening hours" in sent and "We open at 9 and close at 17." in sent
    finally:
        close_window(window)


def test_window_default_settings_refuse_loopback(qtbot, tmp_path, server):
    from app_fakes import close_window

    base, _ = server
    window, engine, widget = _fetch_in_window(qtbot, tmp_path, f"{base}/page", False)
    try:
        sent = engine.requests[1].messages[-1]["content"]
        assert sent.startswith("Error:") and "loopback" in sent
        assert widget.message.tool["is_error"]
    finally:
        close_window(window)


def test_settings_dialog_switch_round_trips(qtbot, tmp_path):
    from app.settings import Settings, SettingsFile
    from app.views.settings_dialog import SettingsDialog

    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    assert not dialog.fetch_private.isChecked()  # off by default
    dialog.fetch_private.setChecked(True)
    settings = dialog.result_settings()
    assert settings.fetch_allow_private is True
    file = SettingsFile(tmp_path / "settings.json")
    file.save(settings)
    assert file.load().fetch_allow_private is True
    (tmp_path / "settings.json").write_text('{"fetch_allow_private": "yes"}')
    assert file.load().fetch_allow_private is False  # only a real true turns it on
