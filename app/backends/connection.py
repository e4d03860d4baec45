"""A remote server the user added, and its models: plain records, no HTTP client (httpx is
imported only when a request is made, so the window opens without it)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_TIMEOUT_S = 60.0


def normalized_base_url(url: str) -> str:
    """'http://host:8080' and 'http://host:8080/v1/' both become 'http://host:8080/v1'."""
    url = url.strip()
    if not url:
        raise ValueError("The base URL is empty")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise ValueError(f"The base URL {url!r} has a port that is not a number") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"The base URL {url!r} is not an http:// or https:// address")
    url = url.rstrip("/")
    if parts.path.strip("/") == "":
        url += "/v1"
    return url


@dataclass(frozen=True)
class Connection:
    """A server the user added (Settings > Connections). The API key is not part of it: it lives
    in the keychain (app/backends/keys.py) and only the client holds it, in memory."""

    id: str
    name: str
    base_url: str
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).netloc

    @property
    def label(self) -> str:
        return f"{self.name} ({self.host})" if self.name != self.host else self.host

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "name": self.name,
            "base_url": self.base_url,
            "timeout_s": self.timeout_s,
        }

    @classmethod
    def from_dict(cls, raw: dict) -> Connection:
        return cls(
            id=str(raw["id"]),
            name=str(raw.get("name") or raw["base_url"]),
            base_url=normalized_base_url(str(raw["base_url"])),
            timeout_s=float(raw.get("timeout_s") or DEFAULT_TIMEOUT_S),
        )


@dataclass(frozen=True)
class RemoteModel:
    id: str
    owned_by: str = ""
    context_length: int | None = None  # when the server reports one (vLLM: max_model_len)
