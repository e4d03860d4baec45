"""LocalChat desktop app (PySide6 widgets). The engine runs on a worker thread; see app/worker.py."""
