"""The grammar of one schema document: the walk over its schemas (`node`), which hands each to the
rule of its combinator (`branch_rule`), its literals (`literal_rule`) or its JSON types
(`scalar_rules`, `array_rule`, `object_rule`), and the rule set they all write into (named rules,
`$ref` targets compiled once, nested objects hoisted, the rule of any JSON value)."""

from __future__ import annotations

from agentspec_sdk.errors import InvalidSchema, SchemaNotSupported
from agentspec_sdk.structure.schema import numbers
from agentspec_sdk.structure.schema.algebra import ANNOTATIONS, TYPES, UNSUPPORTED, ptr, types_of
from agentspec_sdk.structure.schema.array_rule import array_rule
from agentspec_sdk.structure.schema.branch_rule import branch_rule
from agentspec_sdk.structure.schema.document import DEPENDENCY_KEYS, MAX_DEPTH, SchemaDocument
from agentspec_sdk.structure.schema.grammar_ir import (
    EMPTY,
    NOTHING,
    Node,
    Ref,
    alt,
    lit,
    opt,
    productive_rules,
    prune,
    rep,
    seq,
    tok,
)
from agentspec_sdk.structure.schema.json_tokens import JsonTokens
from agentspec_sdk.structure.schema.literal_rule import literal_rule
from agentspec_sdk.structure.schema.object_rule import object_rule
from agentspec_sdk.structure.schema.regex_translate import ANY_CHAR, encode_chars
from agentspec_sdk.structure.schema.scalar_rules import number_rule, string_rule

__all__ = ["SchemaGrammar"]


class SchemaGrammar:
    """Rules named `prefix_*` for the schema `document.root`; `build()` returns (root rule, rules)."""

    def __init__(self, document: SchemaDocument, prefix: str, *, flexible: bool, relax: frozenset,
                 assert_formats: bool, closed: bool, spaced: bool = False, python: bool = False,
                 kwargs: bool = False):
        self.document = document
        self.prefix = prefix
        self.tokens = JsonTokens(flexible, spaced=spaced, python=python)
        self.kwargs = kwargs  # the root object is written as keyword arguments (a Python call's)
        self.relax = relax
        self.assert_formats = assert_formats
        self.closed = closed
        self.rules: dict[str, Node] = {}
        self.ref_rules: dict[str, str] = {}
        self.pending: list[tuple[str, object, str]] = []
        self.counter = 0

    # ------------------------------------------------------------ driver

    def build(self) -> tuple[str, dict[str, Node]]:
        root_name = f"{self.prefix}_root"
        self.rules[root_name] = EMPTY  # placeholder keeps the root first
        self.rules[root_name] = self.node(self.document.root, "", 0)
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

    def define(self, tag: str, node: Node) -> Ref:
        """`node` as a new named rule (`new_rule(tag)`), referenced (`rule_context.RuleContext`)."""
        name = self.new_rule(tag)
        self.rules[name] = node
        return Ref(name)

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
        doc = self.document
        schema = doc.view(schema, pointer)
        meaningful = set(schema) - ANNOTATIONS
        kwargs_root = self.kwargs and depth == 0
        if meaningful == {"$ref"} and not kwargs_root:
            return Ref(self.ref_rule(schema["$ref"], pointer))
        schema = doc.flatten(schema, pointer, frozenset())
        if schema is False:
            return NOTHING
        if kwargs_root:
            _check_kwargs_root(schema, pointer)
        if schema is True or not (set(schema) - ANNOTATIONS):
            return Ref(self.any_rule())
        if any(key in schema for key in DEPENDENCY_KEYS):
            schema = doc.expand_dependencies(schema, pointer)
            if schema is False:
                return NOTHING
        self.check_keywords(schema, pointer)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return branch_rule(self, schema, key, pointer, depth)
        if "enum" in schema or "const" in schema:
            return literal_rule(schema, pointer, self.tokens)
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
        if self.kwargs and depth == 0:  # keyword arguments are an object's members, nothing else
            if "object" not in wanted:
                raise SchemaNotSupported("a Python call's parameters must be an object schema", pointer)
            wanted = ["object"]
        options = []
        for t in dict.fromkeys(wanted):
            if t == "null":
                options.append(self.tokens.constant(None))
            elif t == "boolean":
                options.append(alt(self.tokens.constant(True), self.tokens.constant(False)))
            elif t in ("integer", "number"):
                options.append(number_rule(schema, pointer, t == "integer"))
            elif t == "string":
                options.append(string_rule(schema, pointer, self.relax, self.assert_formats))
            elif t == "array":
                options.append(array_rule(self, schema, pointer, depth))
            elif t == "object":
                options.append(self.hoist(object_rule(self, schema, pointer, depth), depth))
        return alt(*options)

    # ------------------------------------------------------------ rules

    def hoist(self, node: Node, depth: int) -> Node:
        """A nested object gets its own rule: inlined, deep schemas nest parentheses beyond
        llguidance's limit (and python lark's recursion)."""
        if depth == 0 or node in (NOTHING, EMPTY):
            return node
        name = self.new_rule("obj")
        self.rules[name] = node
        return Ref(name)

    def ref_rule(self, ref, pointer: str) -> str:
        target, fragment = self.document.resolve(ref, pointer)
        name = self.ref_rules.get(fragment)
        if name is None:
            name = self.new_rule("ref")
            self.ref_rules[fragment] = name
            self.pending.append((name, target, fragment))
        return name

    def any_rule(self) -> str:
        name = f"{self.prefix}_any"
        if name not in self.rules:
            obj, arr = f"{self.prefix}_anyobj", f"{self.prefix}_anyarr"
            punct = self.tokens.punct
            value = Ref(name)
            string = tok(seq(lit('"'), rep(encode_chars(ANY_CHAR), 0, None), lit('"')))
            comma = punct(",")
            member = seq(string, punct(":"), value)
            self.rules[name] = alt(
                Ref(obj), Ref(arr), string, numbers.number_range(None, None),
                self.tokens.constant(True), self.tokens.constant(False), self.tokens.constant(None),
            )
            self.rules[obj] = seq(punct("{"), opt(seq(member, rep(seq(comma, member), 0, None))), punct("}"))
            self.rules[arr] = seq(punct("["), opt(seq(value, rep(seq(comma, value), 0, None))), punct("]"))
        return name


def _check_kwargs_root(schema, pointer: str) -> None:
    """A Python call's keyword arguments are one object's members: a root that is a union, a literal
    or any value has no keyword-argument form."""
    if schema is True or not isinstance(schema, dict) or not (set(schema) - ANNOTATIONS):
        raise SchemaNotSupported("a Python call's parameters must be an object schema (got any value)",
                                 pointer)
    for key in ("anyOf", "oneOf", "enum", "const", "$ref"):
        if key in schema:
            raise SchemaNotSupported(f"a Python call's parameters must be one object schema ({key!r} at "
                                     "the root has no keyword-argument form)", ptr(pointer, key))
