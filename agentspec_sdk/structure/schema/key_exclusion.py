"""Any JSON string except some names: the undeclared keys of an object, next to its declared ones."""

from __future__ import annotations

from agentspec_sdk.structure.schema.grammar_ir import EMPTY, Node, alt, lit, rep, seq
from agentspec_sdk.structure.schema.regex_translate import ANY_CHAR, encode, encode_chars

__all__ = ["string_not_in"]


def string_not_in(names: list[str]) -> Node:
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
