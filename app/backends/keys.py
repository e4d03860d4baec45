"""Where API keys live: the OS keychain through `keyring` (Secret Service, macOS Keychain,
Windows Credential Locker); where the system has no keychain service (a headless Linux box,
a minimal desktop), a JSON file readable only by the user (0600, in a 0700 directory).

The settings file and the chats database never hold a key: connections refer to theirs by the
connection's id. `KeyStore.where` says in words where keys go, for the settings dialog."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from app.backends.errors import KeyStoreError

SERVICE = "LocalChat"


def _system_keyring():
    """The keychain backend, or None when only keyring's 'fail'/'null' backends exist."""
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:  # pragma: no cover - keyring is a dependency
        return None
    backend = keyring.get_keyring()
    if isinstance(backend, fail.Keyring) or "null" in type(backend).__module__:
        return None
    return backend


class KeyStore:
    def __init__(self, fallback_path: Path, *, use_keychain: bool = True):
        self.fallback_path = Path(fallback_path)
        self._use_keychain = use_keychain
        self._backend_found = False
        self._backend = None

    @property
    def _keyring(self):
        """Found on first use: keyring's backend discovery takes a few hundred ms, which the
        window's start-up must not pay."""
        if not self._backend_found:
            self._backend = _system_keyring() if self._use_keychain else None
            self._backend_found = True
        return self._backend

    @property
    def uses_keychain(self) -> bool:
        return self._keyring is not None

    @property
    def where(self) -> str:
        if self._keyring is not None:
            return f"API keys are kept in the system keychain ({type(self._keyring).__name__})."
        return (
            "No keychain service was found on this system, so API keys are kept in "
            f"{self.fallback_path}, a file only your user account can read (0600)."
        )

    def get(self, connection_id: str) -> str | None:
        if self._keyring is not None:
            try:
                return self._keyring.get_password(SERVICE, connection_id)
            except Exception as exc:  # keyring backends raise their own types
                raise KeyStoreError(f"The keychain could not be read: {exc}") from None
        return self._read_file().get(connection_id)

    def set(self, connection_id: str, key: str | None) -> None:
        """Store the key (None or "" removes it)."""
        if self._keyring is not None:
            try:
                if key:
                    self._keyring.set_password(SERVICE, connection_id, key)
                else:
                    with contextlib.suppress(Exception):  # there was none
                        self._keyring.delete_password(SERVICE, connection_id)
            except Exception as exc:
                raise KeyStoreError(f"The keychain could not save the API key: {exc}") from None
            return
        keys = self._read_file()
        if key:
            keys[connection_id] = key
        else:
            keys.pop(connection_id, None)
        self._write_file(keys)

    def _read_file(self) -> dict[str, str]:
        try:
            raw = json.loads(self.fallback_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise KeyStoreError(
                f"The API key file {self.fallback_path} cannot be read ({type(exc).__name__})"
            ) from None
        return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}

    def _write_file(self, keys: dict[str, str]) -> None:
        path = self.fallback_path
        tmp = path.with_suffix(".tmp")
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(keys, f)
            os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply to an existing file
            os.replace(tmp, path)
        except OSError as exc:
            raise KeyStoreError(
                f"The API key could not be saved to {path}: {exc.strerror}"
            ) from None
