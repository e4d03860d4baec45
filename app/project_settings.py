"""A project's settings and what a chat in a project uses: its own value when it has one, else
the project's, and for each value where it came from (the UI says so, as the preset panel does).

`projects.settings_json` (app/store.py) holds:
  "model":       the default model for the project's chats, as the window opens it (a GGUF path
                 or a "remote://connection/model" path); a chat answered by another model keeps
                 that one (app/session.py's backend binding comes first).
  "preset":      sampling values {GenerationConfig field: value} layered over the model's saved
                 preset and under the values typed in the preset panel.
  "tools":       the ToolRegistry keys offered in a chat of the project that has not chosen its
                 own; None when the project does not set them.
  "collections": the document collections a chat of the project searches (issue 34); kept as
                 stored, a list of collection ids.
Unknown keys are kept as they are, so a newer app's settings survive an older one's save.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from engine.errors import EngineError
from engine.generation_config import GenerationConfig
from engine.types import ResolvedPreset

SOURCE_CHAT = "chat"
SOURCE_PROJECT = "project"
SOURCE_NONE = ""


@dataclass(frozen=True)
class ProjectSettings:
    model: str | None = None
    preset: dict = field(default_factory=dict)
    tools: list[str] | None = None
    collections: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # keys this version does not know, kept

    @classmethod
    def from_json(cls, data: object) -> ProjectSettings:
        """Tolerant: a damaged or odd value costs that one setting, not the project."""
        if not isinstance(data, dict):
            return cls()
        model = data.get("model")
        preset = data.get("preset")
        tools = data.get("tools")
        collections = data.get("collections")
        known = {"model", "preset", "tools", "collections"}
        return cls(
            model=model if isinstance(model, str) and model else None,
            preset=dict(preset) if isinstance(preset, dict) else {},
            tools=[t for t in tools if isinstance(t, str)] if isinstance(tools, list) else None,
            collections=list(collections) if isinstance(collections, list) else [],
            extra={k: v for k, v in data.items() if k not in known},
        )

    def to_json(self) -> dict:
        data = dict(self.extra)
        if self.model:
            data["model"] = self.model
        if self.preset:
            data["preset"] = dict(self.preset)
        if self.tools is not None:
            data["tools"] = sorted(set(self.tools))
        if self.collections:
            data["collections"] = list(self.collections)
        return data


@dataclass(frozen=True)
class Project:
    id: int
    name: str
    system_prompt: str
    settings: ProjectSettings
    position: int
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class ChatDefaults:
    """What one chat uses, and where each value came from (SOURCE_*)."""

    project: Project | None = None
    system_prompt: str = ""
    system_prompt_source: str = SOURCE_NONE
    tools: tuple[str, ...] = ()
    tools_source: str = SOURCE_NONE
    model: str | None = None  # the project's default model (the chat's own binding wins)
    preset: dict = field(default_factory=dict)  # the project's sampling values

    def source_text(self, source: str) -> str:
        """A few words for the UI: "this chat", "project “Essays”", or ""."""
        if source == SOURCE_CHAT:
            return "this chat"
        if source == SOURCE_PROJECT and self.project is not None:
            return f"project “{self.project.name}”"
        return ""


def chat_defaults(own_prompt: str, own_tools: dict, project: Project | None) -> ChatDefaults:
    """A chat's system prompt and tools: its own when it has them (a non-blank prompt; a tools
    record with an "enabled" list, even an empty one: switching every tool off is a choice),
    else the project's."""
    if own_prompt.strip():
        prompt, prompt_source = own_prompt.strip(), SOURCE_CHAT
    elif project is not None and project.system_prompt.strip():
        prompt, prompt_source = project.system_prompt.strip(), SOURCE_PROJECT
    else:
        prompt, prompt_source = "", SOURCE_NONE
    if isinstance(own_tools.get("enabled"), list):
        tools, tools_source = tuple(own_tools["enabled"]), SOURCE_CHAT
    elif project is not None and project.settings.tools is not None:
        tools, tools_source = tuple(project.settings.tools), SOURCE_PROJECT
    else:
        tools, tools_source = (), SOURCE_NONE
    settings = project.settings if project is not None else ProjectSettings()
    return ChatDefaults(
        project=project,
        system_prompt=prompt,
        system_prompt_source=prompt_source,
        tools=tools,
        tools_source=tools_source,
        model=settings.model,
        preset=dict(settings.preset),
    )


def resolve_with_project(
    resolve: Callable[[dict | None, dict | None], ResolvedPreset],
    saved: dict | None,
    overrides: dict | None,
    defaults: ChatDefaults,
) -> tuple[ResolvedPreset, dict]:
    """The preset a chat uses: the model's saved preset, then its project's values, then the
    values typed in the preset panel (`overrides`), each field's source saying which, with
    SOURCE_PROJECT for the project's. Returns the view and the project values it holds (what a
    request passes on). Project values the engine refuses for this model are left out, and a
    note says so: a project must not stop its chats from running."""
    project, typed = defaults.preset, overrides or {}
    if not project:
        return resolve(saved, overrides), {}
    try:
        view = resolve(saved, {**project, **typed})
    except (EngineError, ValueError) as exc:
        view = resolve(saved, overrides)
        note = f"The preset of {defaults.source_text(SOURCE_PROJECT)} was not used: {exc}"
        return replace(view, notes=(*view.notes, note)), {}
    sources = {
        name: SOURCE_PROJECT if name in project and name not in typed else source
        for name, source in view.sources.items()
    }
    return replace(view, sources=sources), dict(project)


class PresetParseError(ValueError):
    """A preset line the dialog cannot read; the message names the line."""


def parse_preset(text: str) -> dict:
    """`field = value` lines (values as JSON: 0.2, true, ["###"]; a bare word is a string) into
    a dict the engine accepts on its own (GenerationConfig); blank lines and # comments skipped.
    Raises PresetParseError or the engine's ConfigValidationError naming the field."""
    values: dict = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, raw = line.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name:
            raise PresetParseError(f"Line {number}: write it as field = value (got “{line}”).")
        try:
            values[name] = json.loads(raw)
        except ValueError:
            values[name] = raw
    GenerationConfig.from_values(values)  # unknown field or bad value: the engine says which
    return values


def format_preset(preset: dict) -> str:
    return "\n".join(f"{name} = {json.dumps(value)}" for name, value in preset.items())
