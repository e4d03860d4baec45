"""The sampling preset the next request will use: the model's saved preset (from settings) plus
this session's unsaved overrides, resolved by the engine so every value carries its source.

An edit is only accepted if the engine's resolution accepts it; otherwise the engine's
ConfigValidationError message is returned and nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.errors import EngineError
from engine.types import ResolvedPreset

Resolver = Callable[[dict | None, dict | None], ResolvedPreset]


class PresetState:
    def __init__(self, resolve: Resolver, saved: dict | None = None):
        self._resolve = resolve
        self.saved: dict = dict(saved or {})
        self.overrides: dict = {}
        self.view: ResolvedPreset = resolve(self.saved or None, None)

    def try_set(self, field: str, value) -> str | None:
        """Apply an override; returns the error message if the engine refuses it."""
        overrides = {**self.overrides, field: value}
        try:
            view = self._resolve(self.saved or None, overrides)
        except (EngineError, ValueError) as exc:
            return str(exc)
        self.overrides, self.view = overrides, view
        return None

    def save(self) -> dict:
        """Make the current values the model's preset; returns what to store in settings."""
        self.saved = {**self.saved, **self.overrides}
        self.overrides = {}
        self.view = self._resolve(self.saved or None, None)
        return dict(self.saved)

    def reset(self) -> None:
        """Back to the checkpoint's values: drop the saved preset and the overrides."""
        self.saved, self.overrides = {}, {}
        self.view = self._resolve(None, None)


def parse_value(text: str, current):
    """Parse what the user typed in the preset table, guided by the current value's type."""
    text = text.strip()
    if isinstance(current, bool):
        lowered = text.lower()
        if lowered in ("true", "yes", "on", "1"):
            return True
        if lowered in ("false", "no", "off", "0"):
            return False
        return text  # the engine names the field and the allowed values
    if isinstance(current, int) or current is None and text.lstrip("-").isdigit():
        try:
            return int(text)
        except ValueError:
            pass
    if isinstance(current, (int, float)) or current is None:
        try:
            return float(text)
        except ValueError:
            return text if text else None
    if isinstance(current, (list, tuple)):
        return [part for part in (p.strip() for p in text.split(",")) if part] if text else []
    return text


def format_value(value) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    if value is None:
        return ""
    return str(value)
