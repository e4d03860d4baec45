"""Widgets only: they render state and emit user intents; app/session.py does the work."""
