"""A schema document as its draft reads it: `$ref` resolution (pointers, anchors), the dialect's
view of each schema, `allOf` and `$ref` siblings merged into one schema (`flatten`), `unevaluated*`
settled over merged scopes, and `dependencies` expanded into alternatives.

Both the grammar (`grammar.SchemaGrammar`) and the canonical texts of instances
(`canonical_writer.CanonicalWriter`) read schemas through it.
"""

from __future__ import annotations

from urllib.parse import unquote

from agentspec_sdk.errors import InvalidSchema, SchemaNotSupported
from agentspec_sdk.structure.schema.algebra import MAX_BRANCH_PRODUCT, explicit_rest, merge, ptr
from agentspec_sdk.structure.schema.dialect import dialect_of

__all__ = ["DEPENDENCY_KEYS", "MAX_DEPTH", "SchemaDocument"]

MAX_DEPTH = 64
DEPENDENCY_KEYS = ("dependencies", "dependentRequired", "dependentSchemas")
_VALUES = ("enum", "const", "default", "examples")  # keywords whose values are data, not schemas


class SchemaDocument:
    """The root schema and what every walk over it needs (dialect, anchors, `$ref` targets)."""

    def __init__(self, root):
        self.root = root
        self._anchors: dict[str, str] | None = None
        _check_nesting(root)
        self.dialect = dialect_of(root)
        self.nested_ids = _has_nested_ids(root)

    # ------------------------------------------------------------ $ref

    def resolve(self, ref, pointer: str) -> tuple[object, str]:
        if not isinstance(ref, str):
            raise InvalidSchema("$ref must be a string", ptr(pointer, "$ref"))
        base, _, fragment = ref.partition("#")
        root_id = self.root.get("$id") or self.root.get("id") if isinstance(self.root, dict) else None
        if base and base != (root_id or "").partition("#")[0]:
            raise SchemaNotSupported(f"remote $ref {ref!r} is not supported", ptr(pointer, "$ref"))
        if self.nested_ids:
            raise SchemaNotSupported("$ref with nested $id base URIs is not supported", ptr(pointer, "$ref"))
        if fragment and not fragment.startswith("/"):
            target = self.anchors().get(fragment)
            if target is None:
                raise InvalidSchema(f"$ref {ref!r} points to no anchor", ptr(pointer, "$ref"))
            fragment = target
        node = self.root
        for raw in fragment.split("/")[1:] if fragment else []:
            part = unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise InvalidSchema(f"$ref {ref!r} points to nowhere", ptr(pointer, "$ref"))
        if not isinstance(node, dict | bool):
            raise InvalidSchema(f"$ref {ref!r} does not point to a schema", ptr(pointer, "$ref"))
        return node, fragment

    def anchors(self) -> dict[str, str]:
        if self._anchors is None:
            found: dict[str, str] = {}

            def walk(node, pointer):
                if isinstance(node, dict):
                    for key in ("$anchor", "$dynamicAnchor"):
                        if isinstance(node.get(key), str):
                            found.setdefault(node[key], pointer)
                    for key in ("$id", "id"):
                        if isinstance(node.get(key), str) and node[key].startswith("#"):
                            found.setdefault(node[key][1:], pointer)
                    for key, value in node.items():
                        if key not in _VALUES:
                            walk(value, ptr(pointer, key))
                elif isinstance(node, list):
                    for i, value in enumerate(node):
                        walk(value, ptr(pointer, i))

            walk(self.root, "")
            self._anchors = found
        return self._anchors

    # ------------------------------------------------------------ dialect

    def view(self, schema: dict, pointer: str) -> dict:
        """The schema as its draft reads it: keywords outside the draft's vocabulary dropped,
        `$ref` alone where the draft ignores its siblings (the document itself is untouched, so
        JSON pointers into it still resolve)."""
        dialect = self.dialect
        if "$ref" in schema and not dialect.ref_siblings:
            return {"$ref": schema["$ref"]}
        if not dialect.items_array and isinstance(schema.get("items"), list):
            raise InvalidSchema("items must be a schema in draft 2020-12 (the array form is prefixItems)",
                                ptr(pointer, "items"))
        if dialect.ignored.isdisjoint(schema):
            return schema
        return {k: v for k, v in schema.items() if k not in dialect.ignored}

    # ------------------------------------------------------------ allOf and $ref siblings

    def flatten(self, schema: dict, pointer: str, inlining: frozenset):
        """Inline `$ref` (with siblings) and merge `allOf` into one schema dict."""
        schema = self.view(schema, pointer)
        parts = []
        rest = {k: v for k, v in schema.items() if k not in ("allOf", "$ref")}
        if "$ref" in schema:
            target, fragment = self.resolve(schema["$ref"], pointer)
            if fragment in inlining:
                raise SchemaNotSupported("a $ref cycle through sibling keywords", ptr(pointer, "$ref"))
            if target is False:
                return False
            if isinstance(target, dict):
                parts.append(self.flatten(target, fragment, inlining | {fragment}))
        if "allOf" in schema:
            members = schema["allOf"]
            if not isinstance(members, list) or not members:
                raise InvalidSchema("allOf must be a non-empty array", ptr(pointer, "allOf"))
            for i, member in enumerate(members):
                if member is False:
                    return False
                if member is True:
                    continue
                if not isinstance(member, dict):
                    raise InvalidSchema("allOf members must be schemas", ptr(pointer, "allOf", i))
                parts.append(self.flatten(member, ptr(pointer, "allOf", i), inlining))
        if any(part is False for part in parts):
            return False
        all_props = all_items = False
        for i, part in enumerate(parts):
            parts[i], props_done, items_done = self.nested_unevaluated(part, pointer)
            all_props, all_items = all_props or props_done, all_items or items_done
        result = dict(rest)
        for part in parts:
            result = merge(result, part, pointer)
            if result is False:
                return False
        return self.settle_unevaluated(result, [rest, *parts], all_props, all_items)

    # ------------------------------------------------------------ unevaluated*

    @staticmethod
    def nested_unevaluated(part: dict, pointer: str) -> tuple[dict, bool, bool]:
        """`unevaluated*` of a schema applied in place (allOf member, $ref beside siblings, anyOf /
        oneOf branch, dependent schema) speaks of that schema's own scope, which merging loses:
        `true` is kept as "everything evaluated" (it accepts all and evaluates all), anything
        else is refused. Returns (part without them, all properties evaluated, all items)."""
        done = {}
        for key in ("unevaluatedProperties", "unevaluatedItems"):
            if key in part:
                if part[key] is not True:
                    raise SchemaNotSupported(f"{key} inside an in-place applicator (allOf, $ref with "
                                             "siblings, anyOf, oneOf, dependentSchemas) is not expressible",
                                             ptr(pointer, key))
                part = {k: v for k, v in part.items() if k != key}
                done[key] = True
        return part, "unevaluatedProperties" in done, "unevaluatedItems" in done

    @staticmethod
    def settle_unevaluated(result: dict, parts: list[dict], all_props: bool, all_items: bool) -> dict:
        """An own `unevaluatedProperties` applies to keys that no `properties`/`patternProperties`
        of the merged parts declares, which is what `object` does with it as additionalProperties,
        unless some part has additionalProperties (then every key is evaluated); the same for
        `unevaluatedItems` and items after the positional ones."""
        if "unevaluatedProperties" in result and (all_props
                                                  or any("additionalProperties" in p for p in parts)):
            result.pop("unevaluatedProperties")
        if "unevaluatedItems" in result and (all_items or any(explicit_rest(p) for p in parts)):
            result.pop("unevaluatedItems")
        return result

    # ------------------------------------------------------------ dependencies

    def expand_dependencies(self, schema: dict, pointer: str):
        """`dependencies` as alternatives: for each key, either it is absent, or it is present with
        its dependent keys (or its dependent schema)."""
        combos: list[dict] = [{}]
        for keyword in DEPENDENCY_KEYS:
            deps = schema.get(keyword)
            if deps is None:
                continue
            if not isinstance(deps, dict):
                raise InvalidSchema(f"{keyword} must be an object", ptr(pointer, keyword))
            for name, dep in deps.items():
                present = self._dependency_present(schema, keyword, name, dep, pointer)
                options = [{"properties": {name: False}}] + ([present] if present is not False else [])
                combos = [m for c in combos for o in options if (m := merge(c, o, pointer)) is not False]
                if len(combos) > MAX_BRANCH_PRODUCT:
                    raise SchemaNotSupported(f"{keyword} expands to too many alternatives",
                                             ptr(pointer, keyword))
        base = {k: v for k, v in schema.items() if k not in DEPENDENCY_KEYS}
        if not combos:
            return False
        return merge(base, {"anyOf": combos}, pointer) if len(combos) > 1 else merge(base, combos[0], pointer)

    def _dependency_present(self, schema: dict, keyword: str, name: str, dep, pointer: str):
        """What holds when key `name` is present: its dependent keys required, or its dependent
        schema (False: the key cannot be present)."""
        if isinstance(dep, list) and all(isinstance(d, str) for d in dep):
            return {"required": [name, *dep]}
        if not isinstance(dep, dict | bool):
            raise InvalidSchema(f"{keyword} values must be arrays of names or schemas",
                                ptr(pointer, keyword, name))
        flat = self.flatten(dep, ptr(pointer, keyword, name), frozenset()) if isinstance(dep, dict) else dep
        if flat is True:
            flat = {}
        if isinstance(flat, dict):
            flat, props_done, items_done = self.nested_unevaluated(flat, ptr(pointer, keyword, name))
            if (props_done and "unevaluatedProperties" in schema) \
                    or (items_done and "unevaluatedItems" in schema):
                raise SchemaNotSupported("unevaluated* beside a dependent schema that evaluates "
                                         "everything is not expressible",
                                         ptr(pointer, keyword, name))
        return False if flat is False else merge({"required": [name]}, flat, pointer)


def _has_nested_ids(root) -> bool:
    """A `$id` below the root changes the base URI of `$ref`s under it (not supported)."""

    def walk(node, top: bool) -> bool:
        if isinstance(node, dict):
            value = node.get("$id")
            if not top and isinstance(value, str) and not value.startswith("#"):
                return True
            return any(walk(v, False) for k, v in node.items() if k not in _VALUES)
        if isinstance(node, list):
            return any(walk(v, False) for v in node)
        return False

    return walk(root, True)


def _check_nesting(document) -> None:
    """Refuse documents nested deeper than a schema of depth MAX_DEPTH can be, before any
    recursive walk (a schema level is at most two JSON levels: `properties`, then the name)."""
    limit = 2 * MAX_DEPTH + 8
    stack = [(document, "", 0)]
    while stack:
        node, pointer, depth = stack.pop()
        if depth > limit:
            raise SchemaNotSupported(f"schema nesting is deeper than {MAX_DEPTH}", pointer)
        if isinstance(node, dict):
            stack.extend((v, ptr(pointer, k), depth + 1) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, ptr(pointer, i), depth + 1) for i, v in enumerate(node))
