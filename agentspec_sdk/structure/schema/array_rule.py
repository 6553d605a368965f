"""Grammar of arrays: positional items (`prefixItems`, or `items: [...]` before 2020-12), the rest
(`items` / `additionalItems` / `unevaluatedItems`), `minItems` / `maxItems`."""

from __future__ import annotations

from agentspec_sdk.errors import InvalidSchema, SchemaNotSupported
from agentspec_sdk.structure.schema.algebra import ptr
from agentspec_sdk.structure.schema.grammar_ir import EMPTY, NOTHING, Node, lit, opt, rep, seq
from agentspec_sdk.structure.schema.keyword_values import non_negative_int
from agentspec_sdk.structure.schema.rule_context import RuleContext

__all__ = ["MAX_ITEMS_BOUND", "array_rule"]

MAX_ITEMS_BOUND = 2_048


def array_rule(g: RuleContext, schema: dict, pointer: str, depth: int) -> Node:
    min_items = non_negative_int(schema, "minItems", pointer, 0)
    max_items = non_negative_int(schema, "maxItems", pointer, None)
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
    prefix_nodes = [g.node(s, ptr(pointer, prefix_key, i), depth + 1) for i, s in enumerate(prefix)]
    rest_node = g.node(rest, ptr(pointer, rest_key), depth + 1)
    comma = g.tokens.punct(",")

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
    if g.tokens.flexible and tail == EMPTY:
        return seq(lit("["), g.tokens.ws(), lit("]"))
    return seq(g.tokens.punct("["), tail, g.tokens.punct("]"))
