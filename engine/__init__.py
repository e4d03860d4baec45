"""Local inference engine: GGUF loading, tokenization, forward pass, sampling, streaming.

This package never imports Qt; the desktop app (`app/`) sits on top of it.
"""
