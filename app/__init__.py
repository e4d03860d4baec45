"""LocalChat desktop app (PySide6 widgets). `python -m app [MODEL.gguf]`; see app/__main__.py.

How the pieces fit (one direction for data, signals back):

    views/*            widgets only: render state, emit user intents
      -> session.py    GUI-thread logic: conversations, requests, live usage, presets
      -> controller.py owns the worker QThread; cancel sets the CancelToken directly
      -> worker.py     EngineWorker on the QThread: load, generate; events -> EventChannel
      -> engine_bridge.py  the only module that calls the engine (lazy imports)
    store.py           SQLite (WAL): every message committed as it completes;
    reply_recorder.py  the streaming reply saved at most 250 ms behind
    settings.py        JSON settings; theme.py, icon.py, resources.py: look and files

The GUI thread never runs a forward pass, a model load or a JIT compile. Streaming text is
drawn by a ~30 Hz frame timer (views/main_window.py), and worker events are merged into
batches before they cross threads, so a fast model cannot flood the event loop
(`python -m tools.stall_probe` measures the stall).
"""
