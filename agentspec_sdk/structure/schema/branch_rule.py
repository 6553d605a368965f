"""Grammar of `anyOf` / `oneOf`: each branch merged with its siblings, as an alternative; a `oneOf`
only where no instance can match two branches (or under the "oneOf" relaxation)."""

from __future__ import annotations

from agentspec_sdk.errors import InvalidSchema, SchemaNotSupported
from agentspec_sdk.structure.schema.algebra import exclusive_required_branches, merge, ptr
from agentspec_sdk.structure.schema.branch_overlap import disjoint, objects_only
from agentspec_sdk.structure.schema.document import SchemaDocument
from agentspec_sdk.structure.schema.grammar_ir import NOTHING, Node, alt
from agentspec_sdk.structure.schema.rule_context import RuleContext

__all__ = ["branch_rule"]


def branch_rule(g: RuleContext, schema: dict, key: str, pointer: str, depth: int) -> Node:
    options = schema[key]
    if not isinstance(options, list) or not options:
        raise InvalidSchema(f"{key} must be a non-empty array", ptr(pointer, key))
    base = {k: v for k, v in schema.items() if k != key}
    merged, raw = _merged_branches(g.document, base, options, key, pointer)
    unevaluated = [k for k in ("unevaluatedProperties", "unevaluatedItems")
                   if any(k in m for _, m in merged)]
    # several branches may hold on an object (unevaluatedProperties) or an array (Items):
    # an overlap elsewhere changes nothing
    matters = {"object", "array"} if "unevaluatedItems" in unevaluated else {"object"}
    if unevaluated and key == "anyOf" and not disjoint([m for _, m in merged], raw, matters):
        # several branches may hold, and each evaluates its own keys: not a per-branch merge
        raise SchemaNotSupported(f"{unevaluated[0]} with anyOf branches that may overlap is not "
                                 "expressible",
                                 ptr(pointer, unevaluated[0]))
    if key == "oneOf" and "oneOf" not in g.relax and not disjoint([m for _, m in merged], raw):
        objects = objects_only(merged, pointer)
        if objects is not None and disjoint([m for _, m in objects], raw):
            merged = objects
    if key == "oneOf" and "oneOf" not in g.relax and not disjoint([m for _, m in merged], raw):
        exclusive = exclusive_required_branches(base,
                                                [flat for _, flat in _flat_options(g.document, options,
                                                                                   pointer)])
        if exclusive is None:
            raise SchemaNotSupported("oneOf branches that may overlap are not expressible",
                                     ptr(pointer, key))
        merged = [(i, m) for i, m in enumerate(exclusive)]
    if not merged:
        return NOTHING
    return alt(*(g.node(m, ptr(pointer, key, i), depth + 1) for i, m in merged))


def _merged_branches(doc: SchemaDocument, base: dict, options: list, key: str,
                     pointer: str) -> tuple[list[tuple[int, dict]], list[dict]]:
    """(index, branch merged with its siblings) of the branches that can hold, and each branch as
    flattened before the merge."""
    merged, raw = [], []
    for i, option in enumerate(options):
        if option is False:
            continue
        if option is True:
            option = {}
        if not isinstance(option, dict):
            raise InvalidSchema(f"{key} members must be schemas", ptr(pointer, key, i))
        flat = doc.flatten(option, ptr(pointer, key, i), frozenset())
        if flat is False:
            continue
        flat, props_done, items_done = doc.nested_unevaluated(flat, ptr(pointer, key, i))
        combined = merge(base, flat, pointer)
        if combined is not False:
            merged.append((i, doc.settle_unevaluated(combined, [base, flat], props_done, items_done)))
            raw.append(flat)
    return merged, raw


def _flat_options(doc: SchemaDocument, options: list, pointer: str) -> list[tuple[int, dict]]:
    out = []
    for i, option in enumerate(options):
        flat = (doc.flatten(option, ptr(pointer, "oneOf", i), frozenset()) if isinstance(option, dict)
                else option)
        if flat is True:
            flat = {}
        if flat is not False:
            out.append((i, flat))
    return out
