"""JSON Schema → grammar (Lark for python lark / llguidance, EBNF for xgrammar).

The grammar's start rule matches exactly the canonical serialisations of the schema's valid
instances (the forms are listed in `compile_schema`'s docstring and docs/schema_coverage.md;
`canonical_texts` writes them). `$schema` picks the draft (`Dialect`). Every lexeme of the Lark
rendering is one whole JSON token, or a fixed piece of a number, so llguidance's lexer never has to
choose between a longer and a shorter lexeme (see `_Compiler.key`). See docs/schema_coverage.md
for what is supported.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from urllib.parse import unquote

from agentspec_sdk.errors import InvalidSchema, SchemaNotSupported
from agentspec_sdk.structure import numbers
from agentspec_sdk.structure.grammar_ir import (
    EMPTY,
    NOTHING,
    Node,
    Ref,
    alt,
    chars,
    lit,
    opt,
    productive_rules,
    prune,
    rep,
    seq,
    to_gbnf,
    to_lark,
    tok,
)
from agentspec_sdk.structure.regex_translate import (
    ANY_CHAR,
    PatternNotSupported,
    classify_keys,
    encode,
    encode_chars,
    parse_pattern,
    string_content,
)
from agentspec_sdk.structure.schema_algebra import (
    ANNOTATIONS,
    HANDLED,
    MAX_BRANCH_PRODUCT,
    TYPES,
    UNSUPPORTED,
    bounds,
    canonical_literal,
    distinguished,
    exclusive_required_branches,
    explicit_rest,
    forbids,
    identity,
    json_equal,
    json_string,
    merge,
    positional,
    ptr,
    satisfies,
    types_of,
)

MAX_DEPTH = 64
# keywords that constrain objects only: a schema made of these (and annotations) holds for every
# value of another type
OBJECT_KEYWORDS = frozenset({
    "properties", "required", "additionalProperties", "patternProperties", "minProperties",
    "maxProperties", "dependencies", "dependentRequired", "dependentSchemas", "propertyNames",
    "unevaluatedProperties",
})
MAX_ENUM = 10_000
MAX_ITEMS_BOUND = 2_048

_DEPENDENCY_KEYS = ("dependencies", "dependentRequired", "dependentSchemas")
_NUMBER_PARTS = re.compile(r"(-?)(\d+)(\.\d+)?([eE][+-]?\d+)?")
RELAXATIONS = {
    "oneOf": "a oneOf whose branches may overlap is compiled as anyOf",
    "format": "formats the compiler cannot express are ignored (as annotations)",
    "uniqueItems": "uniqueItems is ignored (items may repeat)",
    "pattern": "a pattern that cannot be translated is ignored (any string)",
    "multipleOf": "multipleOf is ignored",
}

# Formats as ECMA regexes over the decoded string (approximations documented in schema_coverage.md).
_MONTH_DAY = r"((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))"
_LEAP_YEAR = r"(\d\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
# RFC 3339 full-date, month lengths and leap years exact
_DATE = rf"(\d{{4}}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_TIME = r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
_OCTET = r"(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
FORMATS = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}[Tt]{_TIME}$",
    "email": (r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
              r"(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$"),
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "uri": r"^[A-Za-z][A-Za-z0-9+.-]*:[^\s\"<>\\^`{|}]*$",
    "ipv4": rf"^({_OCTET}\.){{3}}{_OCTET}$",
    "hostname": (r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                 r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"),
}
# Formats the specifications define but this compiler does not express: asserting them is not
# possible, so they raise unless the "format" relaxation is given. Other names are annotations.
KNOWN_FORMATS = {
    "idn-email", "idn-hostname", "ipv6", "uri-reference", "iri", "iri-reference",
    "uri-template", "json-pointer", "relative-json-pointer", "regex", "duration",
}


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


@dataclass(frozen=True)
class SchemaRules:
    """Prefixed rules for one schema: `root` is the rule to reference from a larger grammar."""

    root: str
    lark: str
    gbnf: str


def compile_schema(
    schema, *, whitespace: str = "compact", relax=(), formats: str = "assert", closed: bool = False
) -> str:
    """Lark grammar text whose `start` rule matches the canonical serialisations of valid instances.

    Canonical forms (`canonical_texts(schema, value)` writes them; tests hold each of them):

    - whitespace: none (`whitespace="flexible"`: 1-16 of `[ \\t\\n\\r]` around `{ } [ ] , :`).
    - object keys: the declared keys in the order of the schema's `properties` (after merging
      `allOf`/`$ref` siblings: the parent's properties first, then each member's), absent optional
      ones skipped; then undeclared `required` keys in `required` order (for `dependencies`, the
      key before its dependents); then any other allowed keys, in any order. Each key at most once.
      Under `anyOf`/`oneOf` each branch orders keys by its own merged schema, so an instance may
      have one canonical text per branch.
    - strings: `json.dumps(..., ensure_ascii=False)`'s escapes (`\\"`, `\\\\`, `\\b\\f\\n\\r\\t`,
      other controls `\\u00xx` lowercase; `/` and non-ASCII unescaped).
    - numbers: an integer-valued number as an integer (`1.0` -> `1`, `1e300` -> its digits, never
      `-0`); any other number in positional notation; both with Python's shortest round-trip digits
      (`1e-05` -> `0.00001`), as `canonical_literal` writes them. A `number` without bounds also
      accepts every other JSON number form (fractions, exponents); bounded numbers only `-?int(.digits)?`.
    - enum/const: each value as `canonical_literal` writes it, in the value's own key order.
    """
    rules = schema_rules(schema, "s", whitespace=whitespace, relax=relax, formats=formats, closed=closed)
    return f"start: {rules.root}\n{rules.lark}"


def compile_schema_gbnf(
    schema, *, whitespace: str = "compact", relax=(), formats: str = "assert", closed: bool = False
) -> str:
    """The same grammar in xgrammar's EBNF, rooted at `root`."""
    rules = schema_rules(schema, "s", whitespace=whitespace, relax=relax, formats=formats, closed=closed)
    return f"root ::= {rules.root}\n{rules.gbnf}"


def canonical_texts(schema, value, *, relax=(), closed: bool = False, limit: int = 16) -> list[str]:
    """The canonical serialisations of an instance under a schema's grammar (see `compile_schema`):
    keys in the order the grammar puts them, one text per way the schema's alternatives
    (anyOf/oneOf/dependencies) order them, at most `limit`. If `value` is valid, the grammar of
    the same schema and options accepts at least one of them."""
    compiler = _Compiler(schema, "c", False, frozenset(relax), True)
    compiler.closed = closed
    return compiler.texts(schema, value, "", 0, limit)


def schema_rules(
    schema, prefix: str, *, whitespace: str = "compact", relax=(), formats: str = "assert",
    closed: bool = False
) -> SchemaRules:
    """Prefixed rules (Lark and xgrammar EBNF) for one schema.

    whitespace: "compact" (canonical, default) or "flexible" (up to 16 blanks around punctuation).
    relax: opt-in relaxations, names in RELAXATIONS. formats: "assert" (default) or "ignore"
    (2020-12's annotation-only reading). closed: objects that do not say `additionalProperties`
    admit no undeclared keys (a restriction, for tool calls: no invented arguments).
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", prefix):
        raise ValueError(f"rule prefix {prefix!r} must match [a-z][a-z0-9_]*")
    if whitespace not in ("compact", "flexible"):
        raise ValueError(f"whitespace must be 'compact' or 'flexible', not {whitespace!r}")
    unknown = set(relax) - set(RELAXATIONS)
    if unknown:
        raise ValueError(f"unknown relaxations {sorted(unknown)}; known: {sorted(RELAXATIONS)}")
    if formats not in ("assert", "ignore"):
        raise ValueError(f"formats must be 'assert' or 'ignore', not {formats!r}")
    compiler = _Compiler(schema, prefix, whitespace == "flexible", frozenset(relax), formats == "assert")
    compiler.closed = closed
    root, rules = compiler.build()
    try:
        lark_text = to_lark(rules, prefix.upper() + "_T")
        gbnf_text = to_gbnf(rules, prefix + "_t")
    except ValueError as exc:
        raise SchemaNotSupported(str(exc), "") from exc
    return SchemaRules(root, lark_text, gbnf_text)












class _Compiler:
    def __init__(self, root, prefix: str, flexible: bool, relax: frozenset, assert_formats: bool):
        self.root = root
        self.prefix = prefix
        self.flexible = flexible
        self.relax = relax
        self.assert_formats = assert_formats
        self.closed = False
        self.rules: dict[str, Node] = {}
        self.ref_rules: dict[str, str] = {}
        self.pending: list[tuple[str, object, str]] = []
        self.counter = 0
        self._anchors: dict[str, str] | None = None
        _check_nesting(root)
        self.dialect = dialect_of(root)
        self.nested_ids = self._has_nested_ids(root)

    # ------------------------------------------------------------ driver

    def build(self) -> tuple[str, dict[str, Node]]:
        root_name = f"{self.prefix}_root"
        self.rules[root_name] = EMPTY  # placeholder keeps the root first
        self.rules[root_name] = self.node(self.root, "", 0)
        while self.pending:
            name, schema, pointer = self.pending.pop()
            self.rules[name] = self.node(schema, pointer, pointer.count("/"))
        dead = set(self.rules) - productive_rules(self.rules)
        if root_name in dead:
            raise InvalidSchema("the schema accepts no instance (contradictory constraints, false, or "
                                "recursion without a base case)", "")
        if dead:
            self.rules = {k: prune(v, dead) for k, v in self.rules.items() if k not in dead}
        return root_name, self.rules

    def new_rule(self, tag: str) -> str:
        self.counter += 1
        return f"{self.prefix}_{tag}{self.counter}"

    # ------------------------------------------------------------ tokens and whitespace

    def ws(self) -> Node:
        return (opt(tok(rep(chars([(0x20, 0x20), (0x09, 0x0A), (0x0D, 0x0D)]), 1, 16))) if self.flexible
                else EMPTY)

    def punct(self, c: str) -> Node:
        if not self.flexible:
            return lit(c)
        if c in "{[":
            return seq(lit(c), self.ws())
        if c in "}]":
            return seq(self.ws(), lit(c))
        return seq(self.ws(), lit(c), self.ws())

    def key(self, name: str) -> Node:
        """A declared key: the JSON string alone, one lexeme (its colon is a lexeme of its own).

        Every lexeme is one whole JSON token (or a fixed piece of a number: sign, integer digits,
        fraction, exponent), so a declared key and a generic key terminal at the same position match
        the same text and llguidance's lexer hands the parser both; a key lexeme that swallowed
        its colon would be a longer match the lexer commits to (`{"a":1}` against
        anyOf[{a: string}, any object] died at the `1`)."""
        return lit(canonical_literal(name))

    def value_tokens(self, value) -> Node:
        """A JSON value as the sequence of its tokens, split where every other rule splits them
        (see `key`): an enum/const `{"a":1}` next to an object rule, or `-5.5` next to a number rule,
        must not be one longer lexeme the lexer would commit to."""
        if isinstance(value, dict):
            if not value:
                return self.empty("{", "}")
            members = [seq(self.key(k), self.punct(":"), self.value_tokens(v)) for k, v in value.items()]
            body = [members[0], *(seq(self.punct(","), m) for m in members[1:])]
            return seq(self.punct("{"), *body, self.punct("}"))
        if isinstance(value, list):
            if not value:
                return self.empty("[", "]")
            body = [self.value_tokens(value[0]),
                    *(seq(self.punct(","), self.value_tokens(v)) for v in value[1:])]
            return seq(self.punct("["), *body, self.punct("]"))
        text = canonical_literal(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            sign, digits, fraction, exponent = _NUMBER_PARTS.fullmatch(text).groups()
            return seq(*(lit(part) for part in (sign, digits, fraction, exponent) if part))
        return lit(text)

    def empty(self, open_: str, close: str) -> Node:
        return seq(lit(open_), self.ws(), lit(close)) if self.flexible else seq(lit(open_), lit(close))

    # ------------------------------------------------------------ schemas

    def node(self, schema, pointer: str, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise SchemaNotSupported(f"schema nesting is deeper than {MAX_DEPTH}", pointer)
        if schema is True:
            return Ref(self.any_rule())
        if schema is False:
            return NOTHING
        if not isinstance(schema, dict):
            raise InvalidSchema(f"a schema must be an object or a boolean, got {type(schema).__name__}",
                                pointer)
        schema = self.view(schema, pointer)
        meaningful = set(schema) - ANNOTATIONS
        if meaningful == {"$ref"}:
            return Ref(self.ref_rule(schema["$ref"], pointer))
        schema = self.flatten(schema, pointer, frozenset())
        if schema is False:
            return NOTHING
        if schema is True or not (set(schema) - ANNOTATIONS):
            return Ref(self.any_rule())
        if any(key in schema for key in _DEPENDENCY_KEYS):
            schema = self.expand_dependencies(schema, pointer)
            if schema is False:
                return NOTHING
        self.check_keywords(schema, pointer)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.branches(schema, key, pointer, depth)
        if "enum" in schema or "const" in schema:
            return self.literals(schema, pointer)
        return self.typed(schema, pointer, depth)

    def check_keywords(self, schema: dict, pointer: str) -> None:
        for key in schema:
            if key in UNSUPPORTED:
                if key == "multipleOf" and "multipleOf" in self.relax:
                    continue
                raise SchemaNotSupported(f"keyword {key!r} is not supported", ptr(pointer, key))
        if schema.get("uniqueItems") is True and "uniqueItems" not in self.relax:
            if not (isinstance(schema.get("maxItems"), int) and schema["maxItems"] <= 1):
                raise SchemaNotSupported("keyword 'uniqueItems' is not supported",
                                         ptr(pointer, "uniqueItems"))
        if "$ref" in schema:
            raise SchemaNotSupported("a $ref cycle through sibling keywords", ptr(pointer, "$ref"))

    def expand_dependencies(self, schema: dict, pointer: str):
        """`dependencies` as alternatives: for each key, either it is absent, or it is present with
        its dependent keys (or its dependent schema)."""
        combos: list[dict] = [{}]
        for keyword in _DEPENDENCY_KEYS:
            deps = schema.get(keyword)
            if deps is None:
                continue
            if not isinstance(deps, dict):
                raise InvalidSchema(f"{keyword} must be an object", ptr(pointer, keyword))
            for name, dep in deps.items():
                if isinstance(dep, list) and all(isinstance(d, str) for d in dep):
                    present = {"required": [name, *dep]}
                elif isinstance(dep, dict | bool):
                    flat = (self.flatten(dep, ptr(pointer, keyword, name), frozenset())
                            if isinstance(dep, dict) else dep)
                    if flat is True:
                        flat = {}
                    if isinstance(flat, dict):
                        flat, props_done, items_done = self.nested_unevaluated(flat,
                                                                               ptr(pointer, keyword, name))
                        if (props_done and "unevaluatedProperties" in schema) \
                                or (items_done and "unevaluatedItems" in schema):
                            raise SchemaNotSupported("unevaluated* beside a dependent schema that evaluates "
                                                     "everything is not expressible",
                                                     ptr(pointer, keyword, name))
                    present = False if flat is False else merge({"required": [name]}, flat, pointer)
                else:
                    raise InvalidSchema(f"{keyword} values must be arrays of names or schemas",
                                        ptr(pointer, keyword, name))
                options = [{"properties": {name: False}}] + ([present] if present is not False else [])
                combos = [m for c in combos for o in options if (m := merge(c, o, pointer)) is not False]
                if len(combos) > MAX_BRANCH_PRODUCT:
                    raise SchemaNotSupported(f"{keyword} expands to too many alternatives",
                                             ptr(pointer, keyword))
        base = {k: v for k, v in schema.items() if k not in _DEPENDENCY_KEYS}
        if not combos:
            return False
        return merge(base, {"anyOf": combos}, pointer) if len(combos) > 1 else merge(base, combos[0], pointer)

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

    def ref_rule(self, ref, pointer: str) -> str:
        target, fragment = self.resolve(ref, pointer)
        name = self.ref_rules.get(fragment)
        if name is None:
            name = self.new_rule("ref")
            self.ref_rules[fragment] = name
            self.pending.append((name, target, fragment))
        return name

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
                        if key not in ("enum", "const", "default", "examples"):
                            walk(value, ptr(pointer, key))
                elif isinstance(node, list):
                    for i, value in enumerate(node):
                        walk(value, ptr(pointer, i))

            walk(self.root, "")
            self._anchors = found
        return self._anchors

    @staticmethod
    def _has_nested_ids(root) -> bool:
        """A `$id` below the root changes the base URI of `$ref`s under it (not supported)."""

        def walk(node, top: bool) -> bool:
            if isinstance(node, dict):
                value = node.get("$id")
                if not top and isinstance(value, str) and not value.startswith("#"):
                    return True
                return any(walk(v, False) for k, v in node.items()
                           if k not in ("enum", "const", "default", "examples"))
            if isinstance(node, list):
                return any(walk(v, False) for v in node)
            return False

        return walk(root, True)

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

    def nested_unevaluated(self, part: dict, pointer: str) -> tuple[dict, bool, bool]:
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

    # ------------------------------------------------------------ anyOf / oneOf

    def branches(self, schema: dict, key: str, pointer: str, depth: int) -> Node:
        options = schema[key]
        if not isinstance(options, list) or not options:
            raise InvalidSchema(f"{key} must be a non-empty array", ptr(pointer, key))
        base = {k: v for k, v in schema.items() if k != key}
        merged, raw = [], []
        for i, option in enumerate(options):
            if option is False:
                continue
            if option is True:
                option = {}
            if not isinstance(option, dict):
                raise InvalidSchema(f"{key} members must be schemas", ptr(pointer, key, i))
            flat = self.flatten(option, ptr(pointer, key, i), frozenset())
            if flat is False:
                continue
            flat, props_done, items_done = self.nested_unevaluated(flat, ptr(pointer, key, i))
            combined = merge(base, flat, pointer)
            if combined is not False:
                merged.append((i, self.settle_unevaluated(combined, [base, flat], props_done, items_done)))
                raw.append(flat)
        unevaluated = [k for k in ("unevaluatedProperties", "unevaluatedItems")
                       if any(k in m for _, m in merged)]
        # several branches may hold on an object (unevaluatedProperties) or an array (Items):
        # an overlap elsewhere changes nothing
        matters = {"object", "array"} if "unevaluatedItems" in unevaluated else {"object"}
        if unevaluated and key == "anyOf" and not self.disjoint([m for _, m in merged], raw, matters):
            # several branches may hold, and each evaluates its own keys: not a per-branch merge
            raise SchemaNotSupported(f"{unevaluated[0]} with anyOf branches that may overlap is not "
                                     "expressible",
                                     ptr(pointer, unevaluated[0]))
        if key == "oneOf" and "oneOf" not in self.relax and not self.disjoint([m for _, m in merged], raw):
            objects = self.objects_only(merged, pointer)
            if objects is not None and self.disjoint([m for _, m in objects], raw):
                merged = objects
        if key == "oneOf" and "oneOf" not in self.relax and not self.disjoint([m for _, m in merged], raw):
            exclusive = exclusive_required_branches(base,
                                                    [flat for _, flat in merged_flat(self, options, pointer)])
            if exclusive is None:
                raise SchemaNotSupported("oneOf branches that may overlap are not expressible",
                                         ptr(pointer, key))
            merged = [(i, m) for i, m in enumerate(exclusive)]
        if not merged:
            return NOTHING
        return alt(*(self.node(m, ptr(pointer, key, i), depth + 1) for i, m in merged))

    def disjoint(self, schemas: list[dict], raw: list[dict], matters: set | None = None) -> bool:
        """Whether no instance can match two branches (merged with their siblings; `raw`: as
        written, whose additionalProperties speaks of the branch's own properties only). The
        proofs by keys (`distinguished`, `forbids`) speak of objects only: they count where the
        two branches share no other kind of value (`{"required": ["a"]}` holds for every string),
        or none that `matters` (the kinds of value on which an overlap would matter; None: all)."""
        sets = [self.value_kinds(s) for s in schemas]
        for a in range(len(sets)):
            for b in range(a + 1, len(sets)):
                if not self.kinds_overlap(sets[a], sets[b], schemas[a], schemas[b]):
                    continue
                if self.objects_at_most(sets[a], sets[b], matters) and (
                        distinguished(schemas[a], schemas[b]) or forbids(raw[a], schemas[b])
                        or forbids(raw[b], schemas[a])):
                    continue
                return False
        return True

    @staticmethod
    def objects_at_most(x: set, y: set, matters: set | None = None) -> bool:
        """Whether the values two branches' kinds share (of those that matter) can only be objects."""
        if matters is not None:
            return not ((x & y) - {"object"}) & matters
        if any(isinstance(k, tuple) for k in x | y):  # literals: the keys' proofs do not apply
            return False
        return x & y <= {"object"}

    def objects_only(self, merged: list, pointer: str) -> list | None:
        """oneOf branches restricted to objects, when that is what the oneOf means: two branches
        (merged with their siblings) that constrain nothing but objects both hold for every
        non-object value, so no non-object value matches exactly one branch. None otherwise."""
        free = [m for _, m in merged
                if all(k in ANNOTATIONS or k in OBJECT_KEYWORDS or k not in HANDLED | UNSUPPORTED
                       for k in m)]
        if len(free) < 2:
            return None
        out = []
        for i, m in merged:
            restricted = merge(m, {"type": "object"}, pointer)
            if restricted is not False:
                out.append((i, restricted))
        return out

    @staticmethod
    def kinds_overlap(x: set, y: set, schema_x: dict, schema_y: dict) -> bool:
        """Whether two branches' value kinds may share an instance: literals against literals by
        value, a literal against a typed branch by whether it passes that branch's scalar keywords
        (`{"const": 1}` overlaps `{"type": "integer"}`, not `{"type": "integer", "minimum": 5}`)."""
        lits_x = [k for k in x if isinstance(k, tuple)]
        lits_y = [k for k in y if isinstance(k, tuple)]
        if lits_x and lits_y:
            return bool(x & y)
        if lits_x or lits_y:
            literal_schema, other = (schema_x, schema_y) if lits_x else (schema_y, schema_x)
            values = literal_schema["enum"] if "enum" in literal_schema else [literal_schema["const"]]
            return any(satisfies(v, other, FORMATS) for v in values)
        return bool(x & y)

    def value_kinds(self, schema: dict) -> set[str]:
        if "enum" in schema or "const" in schema:
            values = schema.get("enum", []) if "enum" in schema else [schema["const"]]
            if not isinstance(values, list):
                return set(TYPES)
            return {("lit", identity(v)) for v in values}
        types = types_of(schema)
        kinds = set(types or TYPES)
        if "integer" in kinds:
            kinds.add("number")
        if schema.get("nullable") is True:
            kinds.add("null")
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return set(TYPES)
        return kinds

    # ------------------------------------------------------------ enum / const

    def literals(self, schema: dict, pointer: str) -> Node:
        if "const" in schema:
            values, where = [schema["const"]], ptr(pointer, "const")
        else:
            values, where = schema["enum"], ptr(pointer, "enum")
            if not isinstance(values, list):
                raise InvalidSchema("enum must be an array", where)
            if len(values) > MAX_ENUM:
                raise SchemaNotSupported(f"enum has {len(values)} values, above the limit of {MAX_ENUM}",
                                         where)
        if "const" in schema and "enum" in schema:
            values = ([v for v in values if any(json_equal(v, e) for e in schema["enum"])]
                      if isinstance(schema["enum"], list) else values)
        others = ((set(schema) & (HANDLED | UNSUPPORTED)) - {"enum", "const", "type", "nullable"}
                  - _SCALAR_CHECKS)
        if others:
            raise SchemaNotSupported(f"enum/const combined with {sorted(others)} is not supported", where)
        kept = []
        for value in values:
            try:
                if satisfies(value, schema, FORMATS):
                    kept.append(self.value_tokens(value))
            except (ValueError, TypeError) as exc:
                raise InvalidSchema(f"enum/const value is not JSON: {exc}", where) from exc
        if schema.get("nullable") is True and "null" not in [getattr(k, "text", None) for k in kept]:
            if any(v is None for v in values):
                kept.append(lit("null"))
        return alt(*kept) if kept else NOTHING

    # ------------------------------------------------------------ typed values

    def typed(self, schema: dict, pointer: str, depth: int) -> Node:
        types = types_of(schema)
        if types is None:
            raise InvalidSchema("type must be a type name or an array of them", ptr(pointer, "type"))
        for t in types:
            if t not in TYPES:
                raise InvalidSchema(f"unknown type {t!r}", ptr(pointer, "type"))
        wanted = list(types) if types else list(TYPES)
        if schema.get("nullable") is True and "null" not in wanted:
            wanted.append("null")
        if "number" in wanted and "integer" in wanted:
            wanted.remove("integer")
        options = []
        for t in dict.fromkeys(wanted):
            if t == "null":
                options.append(lit("null"))
            elif t == "boolean":
                options.append(alt(lit("true"), lit("false")))
            elif t in ("integer", "number"):
                options.append(self.number(schema, pointer, t == "integer"))
            elif t == "string":
                options.append(self.string(schema, pointer))
            elif t == "array":
                options.append(self.array(schema, pointer, depth))
            elif t == "object":
                options.append(self.hoist(self.object(schema, pointer, depth), depth))
        return alt(*options)

    def hoist(self, node: Node, depth: int) -> Node:
        """A nested object gets its own rule: inlined, deep schemas nest parentheses beyond
        llguidance's limit (and python lark's recursion)."""
        if depth == 0 or node in (NOTHING, EMPTY):
            return node
        name = self.new_rule("obj")
        self.rules[name] = node
        return Ref(name)

    def number(self, schema: dict, pointer: str, integer: bool) -> Node:
        lower, upper = bounds(schema, pointer)
        try:
            if integer:
                return numbers.integer_range(lower, upper)
            return numbers.number_range(lower, upper)
        except numbers.BoundNotExpressible as exc:
            raise SchemaNotSupported(str(exc), ptr(pointer, exc.keyword)) from exc

    def string(self, schema: dict, pointer: str) -> Node:
        min_len = _non_negative_int(schema, "minLength", pointer, 0)
        max_len = _non_negative_int(schema, "maxLength", pointer, None)
        pattern = schema.get("pattern")
        if pattern is not None and not isinstance(pattern, str):
            raise InvalidSchema("pattern must be a string", ptr(pointer, "pattern"))
        fmt = schema.get("format")
        if fmt is not None and not isinstance(fmt, str):
            raise InvalidSchema("format must be a string", ptr(pointer, "format"))
        if fmt in FORMATS and self.assert_formats:
            if pattern is not None and pattern != FORMATS[fmt]:
                if "pattern" not in self.relax:
                    raise SchemaNotSupported("format together with pattern is not expressible",
                                             ptr(pointer, "format"))
            pattern = FORMATS[fmt]
        elif fmt in KNOWN_FORMATS and self.assert_formats and "format" not in self.relax:
            raise SchemaNotSupported(f"format {fmt!r} is not supported", ptr(pointer, "format"))
        if max_len is not None and max_len < min_len:
            return NOTHING
        try:
            content = string_content(pattern, min_len, max_len)
        except PatternNotSupported as exc:
            if "pattern" not in self.relax:
                raise SchemaNotSupported(f"pattern: {exc}", ptr(pointer, "pattern")) from exc
            content = string_content(None, min_len, max_len)
        return tok(seq(lit('"'), content, lit('"')))

    def array(self, schema: dict, pointer: str, depth: int) -> Node:
        min_items = _non_negative_int(schema, "minItems", pointer, 0)
        max_items = _non_negative_int(schema, "maxItems", pointer, None)
        for key, value in (("minItems", min_items), ("maxItems", max_items)):
            if value is not None and value > MAX_ITEMS_BOUND:
                raise SchemaNotSupported(f"{key} above {MAX_ITEMS_BOUND} is not supported", ptr(pointer, key))
        if max_items is not None and max_items < min_items:
            return NOTHING
        unevaluated = schema.get("unevaluatedItems", True)  # flatten dropped it where items say more
        items = schema.get("items", unevaluated)
        if "prefixItems" in schema:
            prefix, prefix_key = schema["prefixItems"], "prefixItems"
            rest, rest_key = items, "items"
        elif isinstance(items, list):
            prefix, prefix_key = items, "items"
            rest, rest_key = schema.get("additionalItems", unevaluated), "additionalItems"
        else:
            prefix, prefix_key, rest, rest_key = [], "prefixItems", items, "items"
        if not isinstance(prefix, list):
            raise InvalidSchema(f"{prefix_key} must be an array of schemas", ptr(pointer, prefix_key))
        prefix_nodes = [self.node(s, ptr(pointer, prefix_key, i), depth + 1) for i, s in enumerate(prefix)]
        rest_node = self.node(rest, ptr(pointer, rest_key), depth + 1)
        comma = self.punct(",")

        tail: Node = EMPTY
        k = len(prefix_nodes)
        if max_items is None or max_items > k:
            lo = max(min_items - k, 0)
            hi = None if max_items is None else max_items - k
            if k == 0:
                tail = seq(rest_node,
                           rep(seq(comma, rest_node), max(lo - 1, 0), None if hi is None else hi - 1))
                tail = tail if lo > 0 else opt(tail)
            else:
                tail = rep(seq(comma, rest_node), lo, hi)
        elif min_items > k:
            return NOTHING
        for i in range(min(k, max_items if max_items is not None else k) - 1, -1, -1):
            element = seq(comma if i > 0 else EMPTY, prefix_nodes[i], tail)
            tail = element if i < min_items else opt(element)
        if self.flexible and tail == EMPTY:
            return seq(lit("["), self.ws(), lit("]"))
        return seq(self.punct("["), tail, self.punct("]"))

    def object(self, schema: dict, pointer: str, depth: int) -> Node:
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise InvalidSchema("properties must be an object", ptr(pointer, "properties"))
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise InvalidSchema("required must be an array of strings", ptr(pointer, "required"))
        extra = schema.get("additionalProperties", schema.get("unevaluatedProperties", not self.closed))
        if not isinstance(extra, dict | bool):
            raise InvalidSchema("additionalProperties must be a schema", ptr(pointer, "additionalProperties"))
        min_props = _non_negative_int(schema, "minProperties", pointer, 0)
        if min_props > 1:
            raise SchemaNotSupported("minProperties above 1 is not supported", ptr(pointer, "minProperties"))
        pattern_props = schema.get("patternProperties") or {}
        if not isinstance(pattern_props, dict):
            raise InvalidSchema("patternProperties must be an object", ptr(pointer, "patternProperties"))
        colon = self.punct(":")
        members: list[tuple[Node, bool]] = []
        declared = list(dict.fromkeys([*props, *required]))
        for name in declared:
            matching = self.patterns_matching(name, pattern_props, pointer)
            if name in props:
                sub, sub_pointer = props[name], ptr(pointer, "properties", name)
            elif matching:
                sub, sub_pointer = True, ptr(pointer, "patternProperties")
            else:
                sub, sub_pointer = extra, ptr(pointer, "additionalProperties")
            if matching:
                sub = {"allOf": [sub, *matching]}
            value = self.node(sub, sub_pointer, depth + 1)
            if value == NOTHING:
                if name in required:
                    return NOTHING
                continue
            members.append((seq(self.key(name), colon, value), name in required))
        extras = []
        if pattern_props:
            extras = self.pattern_extras(pattern_props, extra, declared, pointer, depth)
        elif extra is not False:
            value = self.node(extra, ptr(pointer, "additionalProperties"), depth + 1)
            if value != NOTHING:
                extras = [(tok(seq(lit('"'), _string_not_in(declared), lit('"'))), value)]
        extra_member = alt(*(seq(key, self.punct(":"), value) for key, value in extras)) if extras else None
        body = self.members(members, extra_member, min_props)
        if body == NOTHING:
            return NOTHING
        if self.flexible and body == EMPTY:
            return seq(lit("{"), self.ws(), lit("}"))
        return seq(self.punct("{"), body, self.punct("}"))

    def patterns_matching(self, name: str, pattern_props: dict, pointer: str) -> list:
        """Schemas of the patternProperties whose pattern matches a declared name."""
        matching = []
        for pattern, pschema in pattern_props.items():
            try:
                languages = classify_keys([parse_pattern(pattern), lit(name)])
            except PatternNotSupported as exc:
                raise SchemaNotSupported(f"patternProperties: {exc}",
                                         ptr(pointer, "patternProperties")) from exc
            if any(tags == frozenset({0, 1}) for tags, _ in languages):
                matching.append(pschema)
        return matching

    def pattern_extras(self, pattern_props: dict, extra, declared: list[str], pointer: str, depth: int):
        """(key lexeme, value) for undeclared keys: keys are split into classes by the set of patterns
        they match (exactly, via a DFA); each class gets the allOf of those patterns' schemas, the
        class matching none gets additionalProperties."""
        where = ptr(pointer, "patternProperties")
        patterns = list(pattern_props)
        try:
            languages = [parse_pattern(p) for p in patterns]
            if declared:
                languages.append(alt(*(lit(n) for n in declared)))
            classes = classify_keys(languages)
        except PatternNotSupported as exc:
            raise SchemaNotSupported(f"patternProperties: {exc}", where) from exc
        out = []
        for tags, keys in classes:
            if declared and len(patterns) in tags:
                continue
            if tags:
                schemas = [pattern_props[patterns[i]] for i in sorted(tags)]
                sub = schemas[0] if len(schemas) == 1 else {"allOf": schemas}
                value = self.node(sub, ptr(where, patterns[min(tags)]), depth + 1)
            else:
                value = self.node(extra, ptr(pointer, "additionalProperties"), depth + 1)
            if value != NOTHING:
                out.append((tok(seq(lit('"'), encode(keys), lit('"'))), value))
        return out

    def members(self, members: list[tuple[Node, bool]], extra: Node | None, min_props: int) -> Node:
        comma = self.punct(",")
        extras_after = rep(seq(comma, extra), 0, None) if extra is not None else EMPTY
        first_required = next((i for i, (_, req) in enumerate(members) if req), None)
        if first_required is not None:
            parts = [opt(seq(m, comma)) for m, _ in members[:first_required]]
            parts.append(members[first_required][0])
            for m, req in members[first_required + 1 :]:
                parts.append(seq(comma, m) if req else opt(seq(comma, m)))
            parts.append(extras_after)
            return seq(*parts)
        # All optional: choose the first present member; the rest follow with commas.
        tail = extras_after
        shared = len(members) > 4
        options = [seq(extra, extras_after)] if extra is not None else []
        for m, _ in reversed(members):
            options.append(seq(m, tail))
            tail = seq(opt(seq(comma, m)), tail)
            if shared:
                name = self.new_rule("tail")
                self.rules[name] = tail
                tail = Ref(name)
        body = alt(*reversed(options)) if options else EMPTY
        if min_props == 0:
            body = opt(body) if options else EMPTY
        elif not options:
            return NOTHING
        return body

    # ------------------------------------------------------------ canonical texts of instances

    def texts(self, schema, value, pointer: str, depth: int, limit: int) -> list[str]:
        """Canonical serialisations of `value` in the key orders this schema's grammar uses: one
        per way its alternatives (anyOf/oneOf/dependencies) order keys, at most `limit`."""
        if depth > MAX_DEPTH or not isinstance(schema, dict):
            return [canonical_literal(value)]
        schema = self.view(schema, pointer)
        if set(schema) - ANNOTATIONS == {"$ref"}:
            target, fragment = self.resolve(schema["$ref"], pointer)
            return self.texts(target, value, fragment, depth + 1, limit)
        flat = self.flatten(schema, pointer, frozenset())
        if isinstance(flat, dict) and any(k in flat for k in _DEPENDENCY_KEYS):
            flat = self.expand_dependencies(flat, pointer)
        if not isinstance(flat, dict):
            return [canonical_literal(value)]
        for key in ("anyOf", "oneOf"):
            if isinstance(flat.get(key), list):
                base = {k: v for k, v in flat.items() if k != key}
                found: list[str] = []
                for i, option in enumerate(flat[key]):
                    option = {} if option is True else option
                    if not isinstance(option, dict):
                        continue
                    branch = self.flatten(option, ptr(pointer, key, i), frozenset())
                    merged = merge(base, branch, pointer) if isinstance(branch, dict) else False
                    if merged is not False:
                        found += self.texts(merged, value, ptr(pointer, key, i), depth + 1, limit)
                return list(dict.fromkeys(found))[:limit] or [canonical_literal(value)]
        if "enum" in flat or "const" in flat:
            values = ([flat["const"]] if "const" in flat
                      else flat["enum"] if isinstance(flat["enum"], list) else [])
            return [next((canonical_literal(v) for v in values if json_equal(v, value)),
                         canonical_literal(value))]
        if isinstance(value, dict):
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
                choices.append([f"{json_string(k)}:{t}"
                                for t in self.texts(sub, value[k], where, depth + 1, limit)])
            return _joined(choices, "{", "}", limit)
        if isinstance(value, list):
            prefix, rest = positional(flat)
            prefix = prefix if isinstance(prefix, list) else []
            choices = [self.texts(prefix[i] if i < len(prefix) else rest, item, ptr(pointer, "items", i),
                                  depth + 1, limit)
                       for i, item in enumerate(value)]
            return _joined(choices, "[", "]", limit)
        return [canonical_literal(value)]

    # ------------------------------------------------------------ any JSON value

    def any_rule(self) -> str:
        name = f"{self.prefix}_any"
        if name not in self.rules:
            obj, arr = f"{self.prefix}_anyobj", f"{self.prefix}_anyarr"
            value = Ref(name)
            string = tok(seq(lit('"'), rep(encode_chars(ANY_CHAR), 0, None), lit('"')))
            comma = self.punct(",")
            member = seq(string, self.punct(":"), value)
            self.rules[name] = alt(
                Ref(obj), Ref(arr), string, numbers.number_range(None, None),
                lit("true"), lit("false"), lit("null"),
            )
            self.rules[obj] = seq(self.punct("{"), opt(seq(member, rep(seq(comma, member), 0, None))),
                                  self.punct("}"))
            self.rules[arr] = seq(self.punct("["), opt(seq(value, rep(seq(comma, value), 0, None))),
                                  self.punct("]"))
        return name


def _search(pattern: str, key: str) -> bool:
    try:
        return re.search(pattern, key) is not None
    except re.error:
        return False


def _joined(choices: list[list[str]], open_: str, close: str, limit: int) -> list[str]:
    out = []
    for parts in itertools.islice(itertools.product(*choices), limit):
        out.append(open_ + ",".join(parts) + close)
    return out


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


# ---------------------------------------------------------------- helpers

_SCALAR_CHECKS = {
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minItems", "maxItems", "required", "format",
}










def _non_negative_int(schema: dict, key: str, pointer: str, default):
    value = schema.get(key, default)
    if value is default:
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidSchema(f"{key} must be a non-negative integer", ptr(pointer, key))
    return value




def _string_not_in(names: list[str]) -> Node:
    """JSON-escaped content of any string except the given ones (extra keys vs declared keys).

    Strings leave the trie of names at some node by a character no name continues with, or end at
    a node that is not a name. Characters that JSON escapes are factored out when no name has one
    (the usual case): deviating by an escaped character is then "any path, escape, anything".
    """
    any_unit = encode_chars(ANY_CHAR)
    if not names:
        return rep(any_unit, 0, None)
    trie: dict = {}
    for name in names:
        node = trie
        for c in name:
            node = node.setdefault(c, {})
        node[None] = True
    plain_names = all(ord(c) >= 0x20 and c not in '"\\' for name in names for c in name)
    escaped_units = encode_chars([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])

    def children(node: dict) -> list[str]:
        return [c for c in node if c is not None]

    def deviate(node: dict) -> Node:
        points = [ord(c) for c in children(node)]
        if plain_names:
            points += [*range(0x20), 0x22, 0x5C]
        options = [encode_chars(_complement_points(points))]
        options += [seq(encode(lit(c)), deviate(node[c])) for c in children(node)]
        return alt(*options)

    def paths(node: dict) -> Node:
        return alt(EMPTY, *(seq(encode(lit(c)), paths(node[c])) for c in children(node)))

    def proper_prefixes(node: dict, path: str) -> list[Node]:
        found = [] if None in node else [encode(lit(path))]
        for c in children(node):
            found += proper_prefixes(node[c], path + c)
        return found

    leave = alt(deviate(trie), seq(paths(trie), escaped_units)) if plain_names else deviate(trie)
    return alt(seq(leave, rep(any_unit, 0, None)), *proper_prefixes(trie, ""))


def _complement_points(points: list[int]) -> list[tuple[int, int]]:
    out, nxt = [], 0
    for p in sorted(set(points)):
        if p > nxt:
            out.append((nxt, p - 1))
        nxt = p + 1
    if nxt <= 0x10FFFF:
        out.append((nxt, 0x10FFFF))
    return out






def merged_flat(compiler, options: list, pointer: str) -> list[tuple[int, dict]]:
    out = []
    for i, option in enumerate(options):
        flat = (compiler.flatten(option, ptr(pointer, "oneOf", i), frozenset()) if isinstance(option, dict)
                else option)
        if flat is True:
            flat = {}
        if flat is not False:
            out.append((i, flat))
    return out


















