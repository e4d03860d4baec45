"""User settings in a JSON file under the platform config directory.

JSON rather than QSettings so the file is readable, testable without Qt, and the per-model saved
sampling presets (nested dicts) round-trip without type surprises. Writes go through a temp file
and os.replace so a kill mid-write never leaves a truncated file.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import platformdirs

THEMES = ("system", "light", "dark")
MAX_RECENT_MODELS = 8
FONT_SIZE_RANGE = (8, 28)
CONTEXT_SIZE_RANGE = (256, 131072)


def default_settings_path() -> Path:
    return Path(platformdirs.user_config_dir("LocalChat", appauthor=False)) / "settings.json"


@dataclass
class Settings:
    threads: int = 0  # 0: let the engine choose (all cores)
    context_size: int = 4096  # 0 is never stored; the engine clamps to the model's limit
    theme: str = "system"
    font_size: int = 11
    recent_models: list[str] = field(default_factory=list)
    last_model: str = ""
    presets: dict[str, dict] = field(default_factory=dict)  # model path -> saved overrides
    json_schema: str = ""  # last schema typed in the schema editor

    def validated(self) -> Settings:
        """Clamp values a hand-edited file may have broken, instead of failing at startup."""
        self.threads = max(0, min(int(self.threads), os.cpu_count() or 1))
        lo, hi = CONTEXT_SIZE_RANGE
        self.context_size = max(lo, min(int(self.context_size), hi))
        if self.theme not in THEMES:
            self.theme = "system"
        lo, hi = FONT_SIZE_RANGE
        self.font_size = max(lo, min(int(self.font_size), hi))
        self.recent_models = [str(p) for p in self.recent_models][:MAX_RECENT_MODELS]
        if not isinstance(self.presets, dict):
            self.presets = {}
        return self

    def remember_model(self, path: str) -> None:
        path = str(path)
        self.recent_models = [path] + [p for p in self.recent_models if p != path]
        self.recent_models = self.recent_models[:MAX_RECENT_MODELS]
        self.last_model = path


class SettingsFile:
    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else default_settings_path()

    def load(self) -> Settings:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return Settings()
        known = {f.name for f in fields(Settings)}
        try:
            return Settings(**{k: v for k, v in raw.items() if k in known}).validated()
        except (TypeError, ValueError):
            return Settings()

    def save(self, settings: Settings) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(settings), indent=2), encoding="utf-8")
        os.replace(tmp, self.path)
