"""JSON Schema → grammar (Lark for python lark / llguidance, EBNF for xgrammar): the public entry points.

The grammar's start rule matches exactly the canonical serialisations of the schema's valid
instances (the forms are listed in `compile_schema`'s docstring and docs/schema_coverage.md;
`canonical_texts` writes them). `$schema` picks the draft (`dialect.Dialect`). Every lexeme
of the Lark rendering is one whole JSON token, or a fixed piece of a number, so llguidance's lexer
never has to choose between a longer and a shorter lexeme (see `json_tokens.JsonTokens.key`). See
docs/schema_coverage.md for what is supported.

The pieces, one object per module: `document` (reading a schema document: `$ref`,
dialect, `allOf` merged, `dependencies` expanded), `grammar` (the walk and its rule set),
`branch_rule` / `branch_overlap` (anyOf, oneOf), `literal_rule` (enum, const), `scalar_rules`,
`array_rule`, `object_rule`, `key_exclusion` (the JSON types), `json_tokens` (punctuation, keys,
literal values), `canonical_writer` (the canonical texts of instances, apart from the grammar).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentspec_sdk.errors import SchemaNotSupported
from agentspec_sdk.structure.schema.canonical_writer import CanonicalWriter
from agentspec_sdk.structure.schema.document import SchemaDocument
from agentspec_sdk.structure.schema.grammar import SchemaGrammar
from agentspec_sdk.structure.schema.grammar_ir import to_gbnf, to_lark

__all__ = [
    "RELAXATIONS", "SchemaRules", "canonical_texts", "compile_schema", "compile_schema_gbnf", "schema_rules",
]

RELAXATIONS = {
    "oneOf": "a oneOf whose branches may overlap is compiled as anyOf",
    "format": "formats the compiler cannot express are ignored (as annotations)",
    "uniqueItems": "uniqueItems is ignored (items may repeat)",
    "pattern": "a pattern that cannot be translated is ignored (any string)",
    "multipleOf": "multipleOf is ignored",
}


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


def canonical_texts(schema, value, *, relax=(), closed: bool = False, limit: int = 16,
                    whitespace: str = "compact", literals: str = "json", root: str = "value") -> list[str]:
    """The canonical serialisations of an instance under a schema's grammar (see `compile_schema`):
    keys in the order the grammar puts them, one text per way the schema's alternatives
    (anyOf/oneOf/dependencies) order them, at most `limit`. If `value` is valid, the grammar of
    the same schema and options (`whitespace` "compact" or "spaced", `literals`, `root`, as
    `schema_rules` takes them) accepts at least one of them."""
    if whitespace not in ("compact", "spaced"):
        raise ValueError(f"canonical texts are 'compact' or 'spaced', not {whitespace!r}")
    writer = CanonicalWriter(SchemaDocument(schema), closed=closed, spaced=whitespace == "spaced",
                             python=literals == "python", kwargs=root == "kwargs")
    return writer.texts(schema, value, "", 0, limit)


def schema_rules(
    schema, prefix: str, *, whitespace: str = "compact", relax=(), formats: str = "assert",
    closed: bool = False, literals: str = "json", root: str = "value"
) -> SchemaRules:
    """Prefixed rules (Lark and xgrammar EBNF) for one schema.

    whitespace: "compact" (canonical, default), "spaced" (`, ` and `: `, json.dumps's default
    separators) or "flexible" (up to 16 blanks around punctuation).
    literals: "json" (default) or "python" (the same values as Python literals: `None`, `True`,
    `False`; JSON's strings, numbers, lists and objects are Python literals already).
    root: "value" (default) or "kwargs": the root object written as a Python call's keyword arguments
    `(a=1, b="x")` in the same canonical key order (its properties must be Python names; no
    undeclared keys; a root that is not one object schema is `SchemaNotSupported`).
    relax: opt-in relaxations, names in RELAXATIONS. formats: "assert" (default) or "ignore"
    (2020-12's annotation-only reading). closed: objects that do not say `additionalProperties`
    admit no undeclared keys (a restriction, for tool calls: no invented arguments).
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", prefix):
        raise ValueError(f"rule prefix {prefix!r} must match [a-z][a-z0-9_]*")
    if whitespace not in ("compact", "spaced", "flexible"):
        raise ValueError(f"whitespace must be 'compact', 'spaced' or 'flexible', not {whitespace!r}")
    if literals not in ("json", "python"):
        raise ValueError(f"literals must be 'json' or 'python', not {literals!r}")
    if root not in ("value", "kwargs"):
        raise ValueError(f"root must be 'value' or 'kwargs', not {root!r}")
    unknown = set(relax) - set(RELAXATIONS)
    if unknown:
        raise ValueError(f"unknown relaxations {sorted(unknown)}; known: {sorted(RELAXATIONS)}")
    if formats not in ("assert", "ignore"):
        raise ValueError(f"formats must be 'assert' or 'ignore', not {formats!r}")
    grammar = SchemaGrammar(SchemaDocument(schema), prefix, flexible=whitespace == "flexible",
                            relax=frozenset(relax), assert_formats=formats == "assert", closed=closed,
                            spaced=whitespace == "spaced", python=literals == "python",
                            kwargs=root == "kwargs")
    root, rules = grammar.build()
    try:
        lark_text = to_lark(rules, prefix.upper() + "_T")
        gbnf_text = to_gbnf(rules, prefix + "_t")
    except ValueError as exc:
        raise SchemaNotSupported(str(exc), "") from exc
    return SchemaRules(root, lark_text, gbnf_text)
