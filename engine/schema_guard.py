"""Structural limits on a JSON schema, checked before it reaches a parser or llguidance.

Two shapes got through before (issue 17): a schema nested ~1,000 levels, which makes Python's json
parser (and any recursive walk) raise RecursionError, and a `$ref` cycle that never reaches a
concrete type (`{"$ref": "#"}`, a -> b -> a), which llguidance accepts at validation and fails on
only at the first generated token. Both checks are iterative, so neither can itself recurse too
deeply. Qt-free: the app's schema editor and the engine's JSON mode share them.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from engine.errors import ConstraintError

# Real schemas nest a few levels per level of data; 64 containers is far above anything
# hand-written and far below the parser's recursion limit (~1,000).
MAX_SCHEMA_DEPTH = 64

# Keywords whose subschemas apply to the *same* value, so a reference cycle through them never
# reaches a concrete type (unlike `properties` or `items`, which move to a nested value).
_SAME_VALUE_KEYWORDS = ("allOf", "anyOf", "oneOf")
_SAME_VALUE_SINGLE = ("not", "if", "then", "else")


def json_text_depth(text: str) -> int:
    """The deepest nesting of objects/arrays in JSON `text`, without parsing it (strings are
    skipped, so brackets inside them do not count). Malformed text gives a best-effort count."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    return deepest


def value_depth(value: Any) -> int:
    """The deepest nesting of dicts/lists in an already parsed value (iterative)."""
    deepest = 0
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_SCHEMA_DEPTH:
            return deepest  # enough to refuse; no need to walk a huge tree further
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def check_depth(depth: int) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise ConstraintError(
            f"The JSON schema is nested {depth} levels deep; at most {MAX_SCHEMA_DEPTH} are "
            "supported"
        )


def find_ref_cycle(schema: Any) -> list[str] | None:
    """A chain of JSON pointers that loops through `$ref` (and allOf/anyOf/oneOf/not/if/then/
    else, which constrain the same value) without ever descending into a nested value; None if
    every reference cycle is guarded by properties/items/... (a legitimately recursive schema)."""
    edges: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    stack: list[tuple[Any, tuple[str, ...]]] = [(schema, ())]
    while stack:
        node, pointer = stack.pop()
        if isinstance(node, list):
            stack.extend((item, (*pointer, str(i))) for i, item in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        targets = []
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            target = _resolve(schema, ref)
            if target is not None:
                targets.append(target)
        for key in _SAME_VALUE_KEYWORDS:
            if isinstance(node.get(key), list):
                targets.extend((*pointer, key, str(i)) for i in range(len(node[key])))
        targets.extend((*pointer, key) for key in _SAME_VALUE_SINGLE if key in node)
        edges[pointer] = targets
        stack.extend((child, (*pointer, str(key))) for key, child in node.items())
    return _first_cycle(edges)


def check_schema_structure(schema: Any) -> None:
    """Raise ConstraintError if `schema` (parsed) is nested too deeply or has an unguarded
    `$ref` cycle."""
    check_depth(value_depth(schema))
    cycle = find_ref_cycle(schema)
    if cycle is not None:
        chain = " -> ".join(cycle)
        raise ConstraintError(
            f"The JSON schema refers to itself without describing any value: {chain}"
        )


def _resolve(schema: Any, ref: str) -> tuple[str, ...] | None:
    """The pointer (as path segments) a local `$ref` names, or None if it names nothing."""
    fragment = unquote(ref[1:])
    if fragment and not fragment.startswith("/"):
        return None  # an anchor name ("#foo"): not followed
    segments = tuple(s.replace("~1", "/").replace("~0", "~") for s in fragment.split("/")[1:])
    node = schema
    for segment in segments:
        if isinstance(node, dict) and segment in node:
            node = node[segment]
        elif isinstance(node, list) and segment.isdigit() and int(segment) < len(node):
            node = node[int(segment)]
        else:
            return None
    return segments


def _first_cycle(edges: dict[tuple[str, ...], list[tuple[str, ...]]]) -> list[str] | None:
    """Iterative depth-first search; the first cycle found, as '#/...' pointers."""
    done: set[tuple[str, ...]] = set()
    for start in edges:
        if start in done:
            continue
        path: list[tuple[str, ...]] = []
        on_path: set[tuple[str, ...]] = set()
        stack = [(start, iter(edges.get(start, ())))]
        path.append(start)
        on_path.add(start)
        while stack:
            node, successors = stack[-1]
            nxt = next(successors, None)
            if nxt is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif nxt in on_path:
                loop = path[path.index(nxt) :] + [nxt]
                return ["#" + "".join("/" + s for s in p) for p in loop]
            elif nxt not in done:
                stack.append((nxt, iter(edges.get(nxt, ()))))
                path.append(nxt)
                on_path.add(nxt)
    return None
