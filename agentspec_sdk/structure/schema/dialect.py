"""What a root schema's `$schema` says about keywords whose meaning differs between drafts."""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentspec_sdk.errors import SchemaNotSupported

__all__ = ["DIALECTS", "Dialect", "dialect_of"]

_KNOWN_DIALECT = re.compile(
    r"https?://json-schema\.org/(draft-0[3-7]/schema|draft/(2019-09|2020-12)/schema)#?"
)
_NEWER_THAN_7 = {"prefixItems", "dependentRequired", "dependentSchemas", "minContains", "maxContains",
                 "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"}


@dataclass(frozen=True)
class Dialect:
    """What `$schema` says about the keywords whose meaning differs between drafts.

    `ignored`: keywords outside the draft's vocabulary (the specification makes them annotations);
    `ref_siblings`: whether keywords beside `$ref` apply (2019-09 on; before, `$ref` alone counts);
    `items_array`: whether `items: [...]` is the positional form (before 2020-12; 2020-12 has
    `prefixItems` and refuses the array form)."""

    name: str
    ignored: frozenset
    ref_siblings: bool
    items_array: bool


DIALECTS = {
    "draft-04": Dialect("draft-04",
                        frozenset(_NEWER_THAN_7
                                  | {"const", "contains", "propertyNames", "if", "then", "else"}), False,
                        True),
    "draft-06": Dialect("draft-06", frozenset(_NEWER_THAN_7 | {"if", "then", "else"}), False, True),
    "draft-07": Dialect("draft-07", frozenset(_NEWER_THAN_7), False, True),
    "2019-09": Dialect("2019-09", frozenset({"prefixItems", "dependencies", "$dynamicRef"}), True, True),
    "2020-12": Dialect("2020-12", frozenset({"dependencies", "additionalItems", "$recursiveRef"}), True,
                       False),
    # no `$schema`: 2020-12, and the keywords 2020-12 dropped keep their older meaning (it would
    # otherwise ignore them, or refuse `items: [...]`)
    "default": Dialect("default", frozenset({"$recursiveRef"}), True, True),
}


def dialect_of(schema) -> Dialect:
    """The dialect a root schema declares with `$schema` (default: 2020-12, see DIALECTS)."""
    uri = schema.get("$schema") if isinstance(schema, dict) else None
    if uri is None:
        return DIALECTS["default"]
    match = _KNOWN_DIALECT.fullmatch(uri) if isinstance(uri, str) else None
    if match is None:
        raise SchemaNotSupported(f"custom meta-schema {uri!r}", "/$schema")
    name = match.group(2) or match.group(1).split("/")[0]
    if name == "draft-03":
        raise SchemaNotSupported("draft-03 schemas are not supported (draft-04 to 2020-12 are)", "/$schema")
    return DIALECTS["draft-04" if name == "draft-05" else name]
