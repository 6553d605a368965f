"""What the rules that recurse into subschemas (`array_rule`, `object_rule`, `branch_rule`) get from
the walk: `RuleContext`, a protocol that `grammar.SchemaGrammar` satisfies. The rules import this
module, never the grammar's, so the walk and its rules form no import cycle, under type checking too."""

from __future__ import annotations

from typing import Protocol

from agentspec_sdk.structure.schema.document import SchemaDocument
from agentspec_sdk.structure.schema.grammar_ir import Node, Ref
from agentspec_sdk.structure.schema.json_tokens import JsonTokens

__all__ = ["RuleContext"]


class RuleContext(Protocol):
    """The walk as a rule sees it: its options, its lexemes, the document, and two callbacks."""

    document: SchemaDocument  # flattening and merging the branches of an anyOf / oneOf
    tokens: JsonTokens  # punctuation, keys and whitespace, one lexeme per JSON token
    relax: frozenset  # the relaxations asked for (compiler.RELAXATIONS)
    kwargs: bool  # the root object is written as a Python call's keyword arguments
    closed: bool  # an object without additionalProperties admits no undeclared key

    def node(self, schema: object, pointer: str, depth: int) -> Node:
        """The grammar of a subschema at `pointer` (`depth` its nesting)."""
        ...

    def define(self, tag: str, node: Node) -> Ref:
        """`node` as a new named rule of the rule set (its name made from `tag`), referenced."""
        ...
