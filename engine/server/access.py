"""Who may talk to the server: the `Host` a request names and the `Origin` a browser sends.

A server on loopback with no API key is reachable by every web page the user opens: a page can
POST to http://127.0.0.1:8080 (a `text/plain` body needs no CORS preflight), and through DNS
rebinding (a name of the attacker's that first resolves to their server, then to 127.0.0.1) it
can even read the answers, its requests then carrying `Host: attacker.example`. So:

- `Host` must name this server: the address it is bound to, `localhost`, `127.0.0.1` or `[::1]`,
  or a name given with `--allowed-host` (`*`: any). Bound to a wildcard address (`0.0.0.0`,
  `::`; only with an API key), any IP address is accepted too: a rebinding attack needs a name,
  and clients on the network reach the server by its address. Refused: 400 `invalid_host`.
- a request carrying `Origin` (every cross-origin browser request, and every browser POST) must
  come from an origin given with `--allowed-origin` / `--cors` (`*`: any). Refused: 403
  `origin_not_allowed`. Requests without `Origin` (curl, SDKs, other programs) are not browser
  requests and pass.

`AccessGuard` applies both before routing, to every route (a rebound page could read /health).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.server.api_errors import ApiError

ANY = "*"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def host_name(header: str) -> str:
    """A Host header's name: lower case, no port, no IPv6 brackets, no trailing dot."""
    value = header.strip().lower()
    if value.startswith("["):
        name, closed, rest = value[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            return value  # malformed: compared as it is, so it matches nothing allowed
    elif value.count(":") == 1:
        name = value.partition(":")[0]
    else:
        name = value  # a plain name, or an unbracketed IPv6 address (no port possible)
    return name.rstrip(".")


def normalise_origin(origin: str) -> str:
    return origin.strip().lower().rstrip("/")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class AccessPolicy:
    hosts: frozenset[str]  # host names (host_name form), or ANY
    any_ip: bool  # bound to a wildcard address: any IP address as Host
    origins: frozenset[str]  # normalised origins, or ANY

    @classmethod
    def build(
        cls, bound_host: str, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()
    ) -> AccessPolicy:
        bound = host_name(bound_host) if bound_host.strip() else ""
        hosts = {*LOOPBACK_HOSTS, *(host_name(h) for h in allowed_hosts)}
        if bound not in WILDCARD_HOSTS:
            hosts.add(bound)
        origins = frozenset(normalise_origin(o) for o in allowed_origins)
        return cls(frozenset(hosts), bound in WILDCARD_HOSTS, origins)

    def check(self, hosts: list[str], origins: list[str]) -> ApiError | None:
        """The refusal for a request with these Host and Origin header values, or None."""
        if ANY not in self.hosts:
            if len(hosts) != 1:
                return ApiError(
                    400,
                    f"A request must carry exactly one Host header (it has {len(hosts)})",
                    code="invalid_host",
                )
            name = host_name(hosts[0])
            if name not in self.hosts and not (self.any_ip and _is_ip(name)):
                return ApiError(
                    400,
                    f"Host {hosts[0][:100]!r} is not this server's name; start the server with "
                    "--allowed-host NAME to accept it",
                    code="invalid_host",
                )
        if ANY not in self.origins:
            for origin in origins:
                if normalise_origin(origin) not in self.origins:
                    return ApiError(
                        403,
                        f"Requests from web pages at {origin[:100]!r} are not allowed; start the "
                        "server with --allowed-origin ORIGIN to allow that page",
                        code="origin_not_allowed",
                    )
        return None


class AccessGuard:
    """ASGI middleware: refuses requests whose Host or Origin the policy does not allow."""

    def __init__(
        self, app: ASGIApp, policy: AccessPolicy, on_refused: Callable[[int], None]
    ) -> None:
        self.app = app
        self.policy = policy
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            refusal = self.policy.check(headers.getlist("host"), headers.getlist("origin"))
            if refusal is not None:
                self.on_refused(refusal.status)
                response = JSONResponse(
                    refusal.body(), status_code=refusal.status, headers={"Connection": "close"}
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
