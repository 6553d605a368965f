"""The JSON Schema compiler: a schema → a grammar (Lark for python lark and llguidance, EBNF for
xgrammar) whose start rule matches exactly the canonical serialisations of its valid instances, and
those canonical texts (docs/schema_coverage.md).

`compiler` holds the entry points named below; `document` and `dialect` read a document, `grammar`
walks it and hands each schema to its rule (`branch_rule`, `literal_rule`, `scalar_rules`,
`array_rule`, `object_rule`; the recursive ones see the walk as a `rule_context.RuleContext`),
`grammar_ir` is the tree both renderings print. It may import the standard library and
`agentspec_sdk.errors` only: nothing of the agent side of `structure` (formats, turns, segments,
tools), which imports it. The names below load on first use, so importing the package is light.
"""

from importlib import import_module

from agentspec_sdk.errors import InvalidSchema, SchemaNotSupported

_LAZY = {
    "RELAXATIONS": "agentspec_sdk.structure.schema.compiler",
    "SchemaRules": "agentspec_sdk.structure.schema.compiler",
    "canonical_texts": "agentspec_sdk.structure.schema.compiler",
    "compile_schema": "agentspec_sdk.structure.schema.compiler",
    "compile_schema_gbnf": "agentspec_sdk.structure.schema.compiler",
    "schema_rules": "agentspec_sdk.structure.schema.compiler",
}

__all__ = ["InvalidSchema", "SchemaNotSupported", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentspec_sdk.structure.schema' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
