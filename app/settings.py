"""User settings in a JSON file under the platform config directory.

JSON rather than QSettings so the file is readable, testable without Qt, and the per-model saved
sampling presets (nested dicts) round-trip without type surprises. Writes go through a temp file
and os.replace so a kill mid-write never leaves a truncated file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import platformdirs

from app.regular_files import FileTooLargeError, NotRegularFileError, read_regular
from engine.compaction import DEFAULT_LONG_CHAT_MODE, LONG_CHAT_MODES
from engine.types import DEFAULT_KV_CACHE_TYPE, KV_CACHE_TYPES

THEMES = ("system", "light", "dark")
MAX_RECENT_MODELS = 8
FONT_SIZE_RANGE = (8, 28)
CONTEXT_SIZE_RANGE = (256, 131072)
MAX_PERSONAS = 200
MAX_PERSONA_CHARS = 100_000  # a system prompt longer than this is not a persona but a document
# The largest settings file read (200 personas of 100,000 ASCII characters take 20 MB); a larger
# file is not one this app wrote, and reading it whole would cost its size in memory.
MAX_SETTINGS_BYTES = 128 * 2**20
PANELS = ("chats", "side")  # the window's side panels that collapse: chats list, right panel


def default_settings_path() -> Path:
    return Path(platformdirs.user_config_dir("LocalChat", appauthor=False)) / "settings.json"


@dataclass
class Settings:
    threads: int = 0  # 0: let the engine choose (all cores)
    context_size: int = 4096  # 0 is never stored; the engine clamps to the model's limit
    kv_cache_type: str = DEFAULT_KV_CACHE_TYPE.value  # a KV_CACHE_TYPES member (q8_0: 0.53x memory)
    theme: str = "system"
    font_size: int = 11
    recent_models: list[str] = field(default_factory=list)
    last_model: str = ""
    presets: dict[str, dict] = field(default_factory=dict)  # model path -> saved overrides
    json_schema: str = ""  # last schema typed in the schema editor
    personas: dict[str, str] = field(default_factory=dict)  # name -> saved system prompt
    # OpenAI-compatible servers (app/backends/openai_client.py Connection.to_dict); never a key
    connections: list[dict] = field(default_factory=list)
    library_folders: list[str] = field(default_factory=list)  # folders the model library scans
    # MCP servers the user added (Tools panel): {"name", "command": [argv] | "url": str}
    mcp_servers: list[dict] = field(default_factory=list)
    collapsed_panels: list[str] = field(default_factory=list)  # PANELS members the user hid
    # base models (model paths) the user chats with in plain completion: the typed text is
    # continued as it is, without a chat template (app/session.py)
    completion_models: list[str] = field(default_factory=list)
    # the fetch_url tool may reach loopback, private and link-local addresses (off: a model
    # could otherwise read the router's page or a cloud metadata service)
    fetch_allow_private: bool = False
    # "When a chat is too long" (engine/compaction.py LONG_CHAT_MODES): drop the oldest turns,
    # offer a summary of them written by the model, or write one without asking
    long_chat: str = DEFAULT_LONG_CHAT_MODE
    # messages sent while a reply streamed, not yet sent: chat id (as text) -> texts in order
    # (app/features/message_queue.py says why they live here and not in the chats database)
    queued_messages: dict[str, list[str]] = field(default_factory=dict)

    def validated(self) -> Settings:
        """Clamp values a hand-edited file may have broken, instead of failing at startup."""
        self.threads = max(0, min(int(self.threads), os.cpu_count() or 1))
        lo, hi = CONTEXT_SIZE_RANGE
        self.context_size = max(lo, min(int(self.context_size), hi))
        if self.kv_cache_type not in KV_CACHE_TYPES:
            self.kv_cache_type = DEFAULT_KV_CACHE_TYPE.value
        if self.theme not in THEMES:
            self.theme = "system"
        lo, hi = FONT_SIZE_RANGE
        self.font_size = max(lo, min(int(self.font_size), hi))
        self.recent_models = [str(p) for p in self.recent_models][:MAX_RECENT_MODELS]
        folders = self.library_folders if isinstance(self.library_folders, list) else []
        self.library_folders = [p for p in folders if isinstance(p, str) and p][:100]
        if not isinstance(self.presets, dict):
            self.presets = {}
        personas = self.personas if isinstance(self.personas, dict) else {}
        self.personas = dict(
            list(
                (name.strip(), prompt)
                for name, prompt in personas.items()
                if isinstance(name, str)
                and name.strip()
                and isinstance(prompt, str)
                and len(prompt) <= MAX_PERSONA_CHARS
            )[:MAX_PERSONAS]
        )
        if not isinstance(self.connections, list):
            self.connections = []
        self.connections = [
            c for c in self.connections if isinstance(c, dict) and c.get("id") and c.get("base_url")
        ]
        self.mcp_servers = [s for s in _list(self.mcp_servers) if _usable_server(s)]
        self.collapsed_panels = [p for p in PANELS if p in _list(self.collapsed_panels)]
        paths = [p for p in _list(self.completion_models) if isinstance(p, str) and p]
        self.completion_models = list(dict.fromkeys(paths))[:1000]
        self.fetch_allow_private = self.fetch_allow_private is True  # "yes" in a hand edit: no
        if self.long_chat not in LONG_CHAT_MODES:
            self.long_chat = DEFAULT_LONG_CHAT_MODE
        queued = self.queued_messages if isinstance(self.queued_messages, dict) else {}
        self.queued_messages = {
            key: [t for t in texts if isinstance(t, str)]
            for key, texts in queued.items()
            if isinstance(key, str) and key.isdigit() and isinstance(texts, list)
        }
        return self

    def remember_model(self, path: str) -> None:
        path = str(path)
        self.recent_models = [path] + [p for p in self.recent_models if p != path]
        self.recent_models = self.recent_models[:MAX_RECENT_MODELS]
        self.last_model = path


def _list(value) -> list:
    return value if isinstance(value, list) else []


def _usable_server(entry) -> bool:
    """An MCP server entry a hand edit has not broken: a name and exactly one of command/url."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return False
    command, url = entry.get("command"), entry.get("url")
    has_command = isinstance(command, list) and bool(command)
    has_command = has_command and all(isinstance(a, str) for a in command)
    has_url = isinstance(url, str) and bool(url.strip())
    return bool(entry["name"].strip()) and has_command != has_url


class SettingsFile:
    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else default_settings_path()
        # For the user (banner and stderr): why the defaults are in use, or why saving failed.
        self.problem: str | None = None
        self.kept_as: Path | None = None  # where an unreadable settings file was moved
        self.read_only = False  # another window owns this data directory: never write

    def load(self) -> Settings:
        """The saved settings; defaults if there are none. A file that cannot be used (not JSON,
        nested so deeply the parser gives up, wrong types) is renamed aside so the next save
        does not overwrite it, and `problem` says so; start-up never fails on it."""
        self.problem = self.kept_as = None
        try:
            text = read_regular(self.path, MAX_SETTINGS_BYTES).decode("utf-8")
        except FileNotFoundError:
            return Settings()
        except NotRegularFileError as exc:
            # Never read (a FIFO blocked start-up, /dev/zero filled memory); moved aside so
            # that saving writes a real file in its place.
            return self._unusable(f"is {exc.kind}, not a regular file, and was not read")
        except FileTooLargeError:
            return self._unusable(
                f"is larger than {MAX_SETTINGS_BYTES // 2**20} MiB, too large to be settings"
            )
        except (OSError, UnicodeDecodeError) as exc:
            return self._unusable(f"cannot be read ({exc})", keep_aside=False)
        try:
            raw = json.loads(text)
        except ValueError as exc:
            return self._unusable(f"is not valid JSON ({exc})")
        except RecursionError:
            return self._unusable("is nested too deeply to read")
        if not isinstance(raw, dict):
            return self._unusable(f"holds a {type(raw).__name__}, not settings")
        known = {f.name for f in fields(Settings)}
        try:
            return Settings(**{k: v for k, v in raw.items() if k in known}).validated()
        except (TypeError, ValueError, RecursionError) as exc:
            return self._unusable(f"has values of the wrong type ({exc})")

    def _unusable(self, why: str, keep_aside: bool = True) -> Settings:
        self.problem = f"The settings file {self.path} {why}; using default settings."
        if keep_aside:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            target = self.path.with_name(f"{self.path.name}.broken-{stamp}")
            try:
                self.path.rename(target)
                self.kept_as = target
                self.problem += f" The old file is kept as {target}"
            except OSError:
                pass
        return Settings()

    def save(self, settings: Settings) -> bool:
        """Write the file 0600 in a 0700 directory; False (and `problem` set) if it cannot be
        written, e.g. a read-only or full disk: settings are not worth failing the app for."""
        if self.read_only:
            return False
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(asdict(settings), indent=2))
            os.replace(tmp, self.path)
        except OSError as exc:
            message = f"Settings could not be saved to {self.path}: {exc}"
            if message != self.problem:
                print(f"LocalChat: {message}", file=sys.stderr)
            self.problem = message
            return False
        return True
