"""RemoteCatalog: the models of every connection, listed off the GUI thread.

"Test connection" and the model picker both need GET /v1/models, which may take the whole
connection timeout on a slow or dead server; each listing runs on a short-lived Python thread
and the result comes back as a queued Qt signal, so the window never waits for a server."""

from __future__ import annotations

import threading
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.backends.connection import Connection
from engine.errors import EngineError


class RemoteCatalog(QObject):
    # connection id, [RemoteModel], error message ("" on success); emitted from a helper thread,
    # delivered queued on the GUI thread (the catalog lives there)
    listed = Signal(str, object, str)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.models: dict[str, list] = {}  # connection id -> the last successful listing
        self.errors: dict[str, str] = {}
        self._threads: list[threading.Thread] = []
        self.listed.connect(self._remember)

    def refresh(
        self, connection: Connection, api_key: str | Callable[[], str | None] | None
    ) -> None:
        """List the connection's models; `api_key` may be a function, then the key is read on the
        helper thread too (the first keychain access can take a while)."""

        def run() -> None:
            from app.backends.openai_client import OpenAIClient  # httpx loads here, not at start

            try:
                key = api_key() if callable(api_key) else api_key
                with OpenAIClient(connection, key) as client:
                    models = client.list_models()
            except EngineError as exc:
                self.listed.emit(connection.id, [], str(exc))
                return
            except Exception as exc:  # anything unexpected still ends the "testing…" state
                self.listed.emit(connection.id, [], f"{type(exc).__name__}: {exc}")
                return
            self.listed.emit(connection.id, models, "")

        thread = threading.Thread(target=run, name=f"list-models-{connection.id}", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def wait(self, timeout_s: float = 30.0) -> None:
        """For shutdown and tests: let running listings end."""
        for thread in self._threads:
            thread.join(timeout_s)

    def _remember(self, connection_id: str, models: list, error: str) -> None:
        if error:
            self.errors[connection_id] = error
        else:
            self.models[connection_id] = list(models)
            self.errors.pop(connection_id, None)
