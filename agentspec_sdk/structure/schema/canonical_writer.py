"""The canonical serialisations of an instance under a schema's grammar (the forms
`compiler.compile_schema` lists): keys in the order the grammar puts them, one text per way
the schema's alternatives (anyOf/oneOf/dependencies) order them. Forced drafting writes these."""

from __future__ import annotations

import itertools
import re

from agentspec_sdk.structure.schema.algebra import (
    ANNOTATIONS,
    canonical_literal,
    json_equal,
    json_string,
    merge,
    positional,
    ptr,
)
from agentspec_sdk.structure.schema.document import DEPENDENCY_KEYS, MAX_DEPTH, SchemaDocument

__all__ = ["CanonicalWriter"]


class CanonicalWriter:
    """Canonical texts of values under schemas of one document; `closed`: objects that do not say
    `additionalProperties` admit no undeclared keys (as the grammar compiled with `closed`)."""

    def __init__(self, document: SchemaDocument, *, closed: bool = False, spaced: bool = False,
                 python: bool = False, kwargs: bool = False):
        self.document = document
        self.closed = closed
        self.python = python  # values as Python literals (None, True, False)
        self.kwargs = kwargs  # the root object as keyword arguments `(a=1, b=2)`
        self.comma, self.colon = (", ", ": ") if spaced else (",", ":")

    def literal(self, value) -> str:
        return canonical_literal(value, python=self.python, spaced=self.comma == ", ")

    def texts(self, schema, value, pointer: str, depth: int, limit: int) -> list[str]:
        """Canonical serialisations of `value` in the key orders this schema's grammar uses: one
        per way its alternatives (anyOf/oneOf/dependencies) order keys, at most `limit`."""
        doc = self.document
        if depth > MAX_DEPTH or not isinstance(schema, dict):
            return [self.literal(value)]
        schema = doc.view(schema, pointer)
        if set(schema) - ANNOTATIONS == {"$ref"}:
            target, fragment = doc.resolve(schema["$ref"], pointer)
            return self.texts(target, value, fragment, depth + 1, limit)
        flat = doc.flatten(schema, pointer, frozenset())
        if isinstance(flat, dict) and any(k in flat for k in DEPENDENCY_KEYS):
            flat = doc.expand_dependencies(flat, pointer)
        if not isinstance(flat, dict):
            return [self.literal(value)]
        for key in ("anyOf", "oneOf"):
            if isinstance(flat.get(key), list):
                return self._branches(flat, key, value, pointer, depth, limit)
        if "enum" in flat or "const" in flat:
            values = ([flat["const"]] if "const" in flat
                      else flat["enum"] if isinstance(flat["enum"], list) else [])
            return [next((self.literal(v) for v in values if json_equal(v, value)),
                         self.literal(value))]
        if isinstance(value, dict):
            return self._object(flat, value, pointer, depth, limit)
        if isinstance(value, list):
            prefix, rest = positional(flat)
            prefix = prefix if isinstance(prefix, list) else []
            choices = [self.texts(prefix[i] if i < len(prefix) else rest, item, ptr(pointer, "items", i),
                                  depth + 1, limit)
                       for i, item in enumerate(value)]
            return _joined(choices, "[", "]", limit, self.comma)
        return [self.literal(value)]

    def _branches(self, flat: dict, key: str, value, pointer: str, depth: int, limit: int) -> list[str]:
        base = {k: v for k, v in flat.items() if k != key}
        found: list[str] = []
        for i, option in enumerate(flat[key]):
            option = {} if option is True else option
            if not isinstance(option, dict):
                continue
            branch = self.document.flatten(option, ptr(pointer, key, i), frozenset())
            merged = merge(base, branch, pointer) if isinstance(branch, dict) else False
            if merged is not False:
                found += self.texts(merged, value, ptr(pointer, key, i), depth + 1, limit)
        return list(dict.fromkeys(found))[:limit] or [self.literal(value)]

    def _object(self, flat: dict, value: dict, pointer: str, depth: int, limit: int) -> list[str]:
        props = flat.get("properties") if isinstance(flat.get("properties"), dict) else {}
        required = [r for r in flat.get("required") or [] if isinstance(r, str)]
        patterns = (flat.get("patternProperties") if isinstance(flat.get("patternProperties"), dict)
                    else {})
        extra = flat.get("additionalProperties", not self.closed)
        declared = list(dict.fromkeys([*props, *required]))
        keys = [k for k in declared if k in value] + [k for k in value if k not in declared]
        choices = []
        for k in keys:
            matching = [sub for pattern, sub in patterns.items() if _search(pattern, k)]
            sub = props[k] if k in props else True if matching else extra
            if matching:
                sub = {"allOf": [sub, *matching]}
            where = ptr(pointer, "properties", k)
            head = f"{k}=" if self.kwargs and depth == 0 else f"{json_string(k)}{self.colon}"
            choices.append([head + t for t in self.texts(sub, value[k], where, depth + 1, limit)])
        if self.kwargs and depth == 0:
            return _joined(choices, "(", ")", limit, self.comma)
        return _joined(choices, "{", "}", limit, self.comma)


def _search(pattern: str, key: str) -> bool:
    try:
        return re.search(pattern, key) is not None
    except re.error:
        return False


def _joined(choices: list[list[str]], open_: str, close: str, limit: int, comma: str) -> list[str]:
    out = []
    for parts in itertools.islice(itertools.product(*choices), limit):
        out.append(open_ + comma.join(parts) + close)
    return out
