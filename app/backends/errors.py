"""Typed errors of a remote (OpenAI-compatible) server, each named for the user.

Every message says what happened, to which host, and what the user can do; none ever contains
the API key (the client builds messages from the host and the server's reply only, and
`redact` removes the key from server text that echoes it back)."""

from __future__ import annotations

from engine.errors import EngineError


class RemoteError(EngineError):
    """Base of every failure talking to a remote server. `host` is "name (host:port)"."""

    def __init__(self, host: str, message: str):
        self.host = host
        super().__init__(message)


class UnreachableHostError(RemoteError):
    """No TCP connection: wrong address or port, server down, DNS failure."""


class TlsError(RemoteError):
    """The TLS handshake failed (bad or self-signed certificate, http:// vs https://)."""


class AuthError(RemoteError):
    """401/403: the API key is missing, wrong or lacks access."""


class UnknownModelError(RemoteError):
    """404: the server has no such model (or no such endpoint under the base URL)."""


class RateLimitedError(RemoteError):
    """429: too many requests; `retry_after_s` from the Retry-After header when sent."""

    def __init__(self, host: str, message: str, retry_after_s: float | None):
        self.retry_after_s = retry_after_s
        super().__init__(host, message)


class ServerError(RemoteError):
    """5xx: the server failed while handling the request."""


class RequestRejectedError(RemoteError):
    """400/422: the server refused a value of the request; the message is the server's text."""


class StreamEndedError(RemoteError):
    """The stream stopped before its `data: [DONE]` (server died, connection cut)."""


class MalformedChunkError(RemoteError):
    """A stream chunk was not the JSON the OpenAI API describes."""


class RemoteTimeoutError(RemoteError):
    """No answer (or no next chunk) within the connection's timeout."""


class KeyStoreError(EngineError):
    """The API key could not be saved or read (keychain and fallback file both failed)."""


def redact(text: str, secret: str | None) -> str:
    """`text` with every occurrence of the secret replaced (servers sometimes quote the key)."""
    if secret:
        text = text.replace(secret, "[API key]")
    return text
