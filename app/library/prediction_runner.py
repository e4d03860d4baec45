"""Predicts off the GUI thread whether each model file will run here (engine/run_prediction.py)
and hands each result back through a Qt signal.

The first request on a machine probes its read bandwidth (~0.3 s, then cached in the data
directory); every request reads the free memory once and then only file headers. A daemon
thread, like the library scan, so it never waits behind a model load; a newer request
supersedes an older one, whose remaining files are skipped and whose results are not emitted.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from engine.errors import EngineError


class PredictionRunner(QObject):
    predicted = Signal(str, object)  # path, engine.run_prediction.RunPrediction
    failed = Signal(str, str)  # path, why no prediction (not runnable, unreadable, ...)

    def __init__(
        self,
        parent: QObject | None = None,
        *,
        cache_path: Path | None = None,
        predict: Callable | None = None,
        machine: Callable | None = None,
    ):
        """cache_path: where the bandwidth probe's result is kept (the app's data directory);
        predict(path, n_ctx, cache_type, machine) and machine(threads) replace the engine's
        (tests pass fakes, so no probe runs)."""
        super().__init__(parent)
        self.cache_path = cache_path
        self._predict = predict or _engine_predict
        self._machine = machine or self._engine_machine
        self._probed = False
        self._generation = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def request(self, paths: list[str], n_ctx: int, cache_type: str, threads: int = 0) -> None:
        """Predict each file for a load at n_ctx (clamped to each model's own limit) with the
        given KV cache type and thread count (0: the engine's default)."""
        with self._lock:
            self._generation += 1
            generation = self._generation
        paths = list(paths)

        def superseded() -> bool:
            return generation != self._generation

        def run() -> None:
            machine = None  # measured at the first file there is (a probe run costs ~0.3 s)
            for path in paths:
                if superseded():
                    return
                if not Path(path).is_file():
                    self._emit("failed", path, "the file is gone")
                    continue
                if machine is None:
                    try:
                        machine = self._machine(threads or None)
                    except Exception as exc:  # every file would fail the same way
                        self._emit("failed", path, f"cannot measure this computer: {exc}")
                        continue
                try:
                    result = self._predict(path, n_ctx, cache_type, machine)
                except (EngineError, OSError, ValueError) as exc:
                    if not superseded():
                        self._emit("failed", path, str(exc))
                    continue
                if not superseded():
                    self._emit("predicted", path, result)

        thread = threading.Thread(target=run, name="run-prediction", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _engine_machine(self, threads: int | None):
        """This machine; the first time in this app session the bandwidth is probed again and
        the better of the new and the cached value kept (a probe taken while other programs
        were busy reads low and would otherwise stay in the cache for good)."""
        from engine.run_prediction import this_machine

        first, self._probed = not self._probed, True
        return this_machine(threads, self.cache_path, remeasure=first)

    def _emit(self, name: str, *args) -> None:
        """Emit from the worker thread; a runner deleted meanwhile (its window closed while a
        file was being read) has no one left to tell."""
        with contextlib.suppress(RuntimeError):  # "Signal source has been deleted"
            getattr(self, name).emit(*args)

    def wait(self, timeout: float = 10.0) -> None:
        """For shutdown and tests: let running predictions end."""
        for thread in self._threads:
            thread.join(timeout)


def _engine_predict(path: str, n_ctx: int, cache_type: str, machine):
    from engine.run_prediction import predict_file

    return predict_file(path, n_ctx=n_ctx, cache_type=cache_type, machine=machine)
