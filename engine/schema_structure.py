"""Structural checks of a JSON schema that the grammar library gets wrong or reports too late.

- Depth. llguidance reads the schema with a recursion limit of 128 nested containers and answers
  "recursion limit exceeded" past it, and Python's own json decoder raises RecursionError near
  1,000. A schema deeper than MAX_SCHEMA_DEPTH is refused up front with the limit named; the walk
  here is iterative, so it never recurses itself.
- `$ref` cycles with no way out. A recursive schema is fine when the recursion can stop (a tree
  whose `children` array may be empty). It is not when every path through the cycle is mandatory:
  `{"$ref": "#"}`, two definitions that only refer to each other, `allOf` around a self-reference,
  a required property or a `minItems >= 1` array of the schema itself. No finite JSON value
  matches such a schema; llguidance accepts it, then fails at the first token (or lets the model
  write forever). A reachable definition that can produce no finite value is refused by name.

"Productive" (can produce a finite value) is the least fixed point over the `$ref` targets:
every target starts unproductive and becomes productive once its schema can be satisfied given the
targets already known to be productive. Only cycles are judged here: anything this module does not
model (a `false` schema, contradictory bounds, `not`, conditionals) counts as productive and is
left to the grammar library's own validation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import unquote

from engine.errors import ConstraintError

MAX_SCHEMA_DEPTH = 100  # nested objects/arrays in the schema document (llguidance stops at 128)

# Keywords whose value is one subschema / a list of subschemas / a map of name -> subschema.
_SUBSCHEMA = ("additionalProperties", "items", "not", "if", "then", "else", "contains",
              "propertyNames", "unevaluatedProperties", "unevaluatedItems", "additionalItems")  # fmt: skip
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")


def check_schema_depth(schema: Any) -> None:
    """Refuse a schema document nested deeper than MAX_SCHEMA_DEPTH containers."""
    stack = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > MAX_SCHEMA_DEPTH:
            raise ConstraintError(
                f"The JSON schema is nested more than {MAX_SCHEMA_DEPTH} levels deep "
                f"(the schema depth limit is {MAX_SCHEMA_DEPTH})"
            )
        stack.extend((child, depth + 1) for child in children)


def _subschemas(node: dict, *, with_definitions: bool) -> Iterator[Any]:
    for key in _SUBSCHEMA:
        if isinstance(node.get(key), (dict, bool)):
            yield node[key]
    for key in _SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            yield from node[key]
    for key in _SUBSCHEMA_MAPS:
        if key in ("$defs", "definitions") and not with_definitions:
            continue
        if isinstance(node.get(key), dict):
            yield from node[key].values()


def _local_pointer(ref: Any) -> str | None:
    return ref if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")) else None


def _resolve(root: Any, pointer: str) -> Any:
    """The node a local `#/a/b` reference points at, or None when there is no such node."""
    node = root
    for raw in pointer[2:].split("/") if pointer != "#" else ():
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _all_nodes(root: Any) -> Iterator[dict]:
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(_subschemas(node, with_definitions=True))


def _productive(node: Any, known: dict[str, bool]) -> bool:
    """Can `node` produce a finite value, given which `$ref` targets are known to? (Recursion
    depth is bounded by check_schema_depth.)"""
    if not isinstance(node, dict):
        return True
    pointer = _local_pointer(node.get("$ref"))
    if pointer is not None and not known.get(pointer, True):
        return False
    if isinstance(node.get("allOf"), list) and not all(
        _productive(s, known) for s in node["allOf"]
    ):
        return False
    for key in ("anyOf", "oneOf"):
        options = node.get(key)
        if (
            isinstance(options, list)
            and options
            and not any(_productive(s, known) for s in options)
        ):
            return False
    types = node.get("type")
    if types is None:
        return True  # any JSON type may satisfy it, e.g. a string satisfies "required"
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
    return not types or any(_type_productive(node, t, known) for t in types)


def _type_productive(node: dict, type_name: Any, known: dict[str, bool]) -> bool:
    if type_name == "object":
        properties = node.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = node.get("required")
        required = required if isinstance(required, list) else []
        return all(_productive(properties[name], known) for name in required if name in properties)
    if type_name == "array":
        min_items = node.get("minItems", 0)
        min_items = min_items if isinstance(min_items, int) else 0
        prefix = node.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        if not all(_productive(s, known) for s in prefix[:min_items]):
            return False
        items = node.get("items")
        return min_items <= len(prefix) or not isinstance(items, dict) or _productive(items, known)
    return True


def check_ref_cycles(schema: Any) -> None:
    """Refuse a schema whose reachable `$ref` cycles admit no finite value (see the module doc)."""
    targets: dict[str, Any] = {}
    for node in _all_nodes(schema):
        pointer = _local_pointer(node.get("$ref"))
        if pointer is not None and pointer not in targets:
            targets[pointer] = _resolve(schema, pointer)
    if not targets:
        return
    known = dict.fromkeys(targets, False)
    changed = True
    while changed:  # monotone (False -> True only), so at most len(targets) + 1 rounds
        changed = False
        for pointer, target in targets.items():
            if not known[pointer] and (target is None or _productive(target, known)):
                known[pointer] = changed = True
    if all(known.values()):
        return
    # Only what the root can reach matters: an unused broken definition is harmless.
    seen: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        pointer = _local_pointer(node.get("$ref"))
        if pointer is not None and pointer not in seen:
            if not known[pointer]:
                raise ConstraintError(
                    f"The JSON schema has a $ref cycle with no way out: {pointer!r} refers back to "
                    "itself through required steps only (a $ref, allOf, a required property or "
                    "minItems >= 1), so no finite JSON value matches it; make one step optional"
                )
            seen.add(pointer)
            stack.append(targets[pointer])
        stack.extend(_subschemas(node, with_definitions=False))
