"""ECMA-262 regex (JSON Schema `pattern`) → grammar IR over the JSON-escaped form of a string.

A pattern applies to the decoded string, while the grammar sees the string as canonically
serialised (`json.dumps(..., ensure_ascii=False)`): `"` `\\` and control characters appear as escape
sequences. So the pattern is parsed into IR over decoded code points, then every character set is
mapped to the canonical encodings of its members (`encode`).

Supported: literals, `.`, classes (with ranges, negation, `\\d\\w\\s` and their negations), groups
(capturing, `(?:`, named), alternation, quantifiers (`* + ? {n} {n,} {n,m}`, lazy or not), `^`/`$`
at the ends of top-level alternatives. Not expressible (raise `PatternNotSupported`): lookaround,
backreferences, word boundaries, anchors elsewhere.
"""

from __future__ import annotations

from agentspec_sdk.errors import PatternNotSupported
from agentspec_sdk.structure.schema.grammar_ir import (
    EMPTY,
    MAX_CODEPOINT,
    Alt,
    Chars,
    Lit,
    Node,
    Rep,
    Seq,
    alt,
    chars,
    complement,
    lit,
    rep,
    seq,
)

DIGIT = [(0x30, 0x39)]
WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
SPACE = [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
         (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]
LINE_TERMINATORS = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]
ANY_CHAR = [(0, MAX_CODEPOINT)]
_CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}
_CONTROL_ESCAPES = {"t": 9, "n": 10, "v": 11, "f": 12, "r": 13, "0": 0}
MAX_REPEAT = 10_000


class _Anchor:
    def __init__(self, kind: str):
        self.kind = kind


class _Parser:
    def __init__(self, pattern: str):
        self.p = pattern
        self.i = 0

    def error(self, what: str) -> PatternNotSupported:
        return PatternNotSupported(f"{what} at offset {self.i} in pattern {self.p!r}")

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.p[j] if j < len(self.p) else ""

    def take(self) -> str:
        c = self.peek()
        if not c:
            raise self.error("unexpected end")
        self.i += 1
        return c

    def alternatives(self) -> list[list]:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.sequence())
        return branches

    def sequence(self) -> list:
        items: list = []
        while self.peek() and self.peek() not in "|)":
            atom = self.atom()
            if isinstance(atom, _Anchor):
                items.append(atom)
                continue
            items.append(self.quantified(atom))
        return items

    def quantified(self, atom: Node) -> Node:
        while True:
            c = self.peek()
            if c == "*":
                lo, hi = 0, None
            elif c == "+":
                lo, hi = 1, None
            elif c == "?":
                lo, hi = 0, 1
            elif c == "{" and self._counted() is not None:
                lo, hi, length = self._counted()
                self.i += length - 1
            else:
                return atom
            self.i += 1
            if self.peek() == "?":
                self.i += 1  # lazy: same language
            if max(lo, hi or 0) > MAX_REPEAT:
                raise self.error(f"repetition count above {MAX_REPEAT}")
            atom = Rep(atom, lo, hi) if not (lo == 1 and hi == 1) else atom

    def _counted(self):
        j = self.p.find("}", self.i)
        if j < 0:
            return None
        body = self.p[self.i + 1 : j]
        parts = body.split(",")
        if len(parts) > 2 or not parts[0].isdigit() or (len(parts) == 2 and parts[1]
                                                        and not parts[1].isdigit()):
            return None
        lo = int(parts[0])
        hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
        if hi is not None and hi < lo:
            raise self.error("quantifier range out of order")
        return lo, hi, j - self.i + 1

    def atom(self):
        c = self.take()
        if c == "^":
            return _Anchor("^")
        if c == "$":
            return _Anchor("$")
        if c == ".":
            return chars(complement(LINE_TERMINATORS))
        if c == "(":
            return self.group()
        if c == "[":
            return self.char_class()
        if c == "\\":
            return self.escape(in_class=False)
        if c in "*+?":
            raise self.error("nothing to repeat")
        if c == "{" and self._counted_at_prev():
            raise self.error("nothing to repeat")
        return lit(c)

    def _counted_at_prev(self) -> bool:
        self.i -= 1
        found = self._counted() is not None
        self.i += 1
        return found

    def group(self) -> Node:
        if self.peek() == "?":
            nxt = self.peek(1)
            if nxt == ":":
                self.i += 2
            elif nxt == "<" and self.peek(2) not in "=!":
                end = self.p.find(">", self.i)
                if end < 0:
                    raise self.error("unterminated group name")
                self.i = end + 1
            else:
                raise self.error("lookaround or inline flags are not expressible")
        branches = self.alternatives()
        if self.take() != ")":
            raise self.error("unbalanced parenthesis")
        nodes = []
        for branch in branches:
            if any(isinstance(x, _Anchor) for x in branch):
                raise self.error("anchor inside a group")
            nodes.append(seq(*branch))
        return alt(*nodes)

    def char_class(self) -> Node:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.take()
            if c == "]" and not (first and False):
                break
            first = False
            lo_set = self.class_atom(c)
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                hi_set = self.class_atom(self.take())
                if len(lo_set) != 1 or len(hi_set) != 1 or lo_set[0][0] != lo_set[0][1] \
                        or hi_set[0][0] != hi_set[0][1]:
                    raise self.error("class escape used as a range bound")
                lo, hi = lo_set[0][0], hi_set[0][0]
                if hi < lo:
                    raise self.error("class range out of order")
                ranges.append((lo, hi))
            else:
                ranges.extend(lo_set)
        if negate:
            ranges = complement(ranges)
        node = chars(ranges)
        return node

    def class_atom(self, c: str) -> list[tuple[int, int]]:
        if c != "\\":
            return [(ord(c), ord(c))]
        e = self.take()
        if e == "b":
            return [(8, 8)]
        if e == "-":
            return [(0x2D, 0x2D)]
        node = self._escape_body(e)
        return node

    def escape(self, in_class: bool):
        e = self.take()
        if e in "bB":
            raise self.error("word boundaries are not expressible")
        if e.isdigit() and e != "0":
            raise self.error("backreferences are not expressible")
        if e == "k":
            raise self.error("backreferences are not expressible")
        ranges = self._escape_body(e)
        return chars(ranges)

    def _escape_body(self, e: str) -> list[tuple[int, int]]:
        if e in _CLASS_ESCAPES:
            return list(_CLASS_ESCAPES[e])
        if e.upper() == e and e.lower() in _CLASS_ESCAPES:
            return complement(_CLASS_ESCAPES[e.lower()])
        if e in _CONTROL_ESCAPES:
            cp = _CONTROL_ESCAPES[e]
            return [(cp, cp)]
        if e == "x":
            return [self._hex(2)] * 1
        if e == "u":
            if self.peek() == "{":
                end = self.p.find("}", self.i)
                if end < 0:
                    raise self.error("unterminated \\u{")
                cp = int(self.p[self.i + 1 : end], 16)
                self.i = end + 1
                return [(cp, cp)]
            return [self._hex(4)]
        if e == "c":
            letter = self.take()
            cp = ord(letter) % 32
            return [(cp, cp)]
        if e in "pP":
            raise self.error("unicode property escapes are not supported")
        if e.isalnum():
            raise self.error(f"unknown escape \\{e}")
        return [(ord(e), ord(e))]

    def _hex(self, n: int) -> tuple[int, int]:
        text = self.p[self.i : self.i + n]
        if len(text) != n or any(c not in "0123456789abcdefABCDEF" for c in text):
            raise self.error("bad hex escape")
        self.i += n
        cp = int(text, 16)
        return (cp, cp)


def parse_pattern(pattern: str) -> Node:
    """Decoded-string IR of an ECMA pattern with JSON Schema's search semantics made explicit."""
    parser = _Parser(pattern)
    branches = parser.alternatives()
    if parser.i != len(pattern):
        raise parser.error("unbalanced parenthesis")
    any_text = Rep(chars(ANY_CHAR), 0, None)
    nodes = []
    for branch in branches:
        start = bool(branch) and isinstance(branch[0], _Anchor) and branch[0].kind == "^"
        body = branch[1:] if start else branch
        end = bool(body) and isinstance(body[-1], _Anchor) and body[-1].kind == "$"
        body = body[:-1] if end else body
        if any(isinstance(x, _Anchor) for x in body):
            raise parser.error("anchor in the middle of a pattern")
        nodes.append(seq(EMPTY if start else any_text, *body, EMPTY if end else any_text))
    return alt(*nodes)


def length_bounds(node: Node) -> tuple[int, int | None]:
    """Fewest and most characters a decoded-string node matches (None: unbounded)."""
    if isinstance(node, Lit):
        return len(node.text), len(node.text)
    if isinstance(node, Chars):
        return 1, 1
    if isinstance(node, Seq):
        lo, hi = 0, 0
        for item in node.items:
            a, b = length_bounds(item)
            lo += a
            hi = None if hi is None or b is None else hi + b
        return lo, hi
    if isinstance(node, Alt):
        bounds = [length_bounds(i) for i in node.items]
        return min(b[0] for b in bounds), (None if any(b[1] is None for b in bounds)
                                           else max(b[1] for b in bounds))
    if isinstance(node, Rep):
        a, b = length_bounds(node.item)
        hi = None if node.max is None or b is None else b * node.max
        return a * node.min, hi
    raise TypeError(node)


def constrain_length(node: Node, min_len: int, max_len: int | None) -> Node | None:
    """The node restricted to lengths in [min_len, max_len], when that is a simple rewrite.

    Handles the common shape: fixed-width parts around a single variable repetition of a
    fixed-width item (e.g. `^[a-z][a-z0-9_]*$` with maxLength 32). Returns None otherwise.
    """
    lo, hi = length_bounds(node)
    if lo >= min_len and (max_len is None or (hi is not None and hi <= max_len)):
        return node
    items = node.items if isinstance(node, Seq) else (node,)
    variable = [k for k, item in enumerate(items) if length_bounds(item)[0] != length_bounds(item)[1]]
    if len(variable) != 1 or not isinstance(items[variable[0]], Rep):
        return None
    r = items[variable[0]]
    width_lo, width_hi = length_bounds(r.item)
    if width_lo != width_hi or width_lo == 0:
        return None
    fixed = sum(length_bounds(item)[0] for k, item in enumerate(items) if k != variable[0])
    need_lo = max(r.min, -(-(min_len - fixed) // width_lo))
    cap = None if max_len is None else (max_len - fixed) // width_lo
    need_hi = r.max if cap is None else (cap if r.max is None else min(r.max, cap))
    new = list(items)
    new[variable[0]] = rep(r.item, need_lo, need_hi)
    return seq(*new)


# ---------------------------------------------------------------- decoded → JSON-escaped

_SHORT_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
_NEEDS_ESCAPE = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]


def escaped(cp: int) -> str:
    """The canonical (`json.dumps(ensure_ascii=False)`) encoding of one code point."""
    if cp in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[cp]
    if cp < 0x20:
        return f"\\u{cp:04x}"
    return chr(cp)


def encode_chars(ranges) -> Node:
    """One decoded character from `ranges`, as it appears inside a canonical JSON string."""
    plain = _intersect(ranges, complement(_NEEDS_ESCAPE))
    special = _intersect(ranges, _NEEDS_ESCAPE)
    options = [chars(plain)] if plain else []
    long_form: dict[str, list[int]] = {}
    for lo, hi in special:
        for cp in range(lo, hi + 1):
            text = escaped(cp)
            if text.startswith("\\u"):
                long_form.setdefault(text[:-1], []).append(ord(text[-1]))
            else:
                options.append(lit(text))
    for head, last in long_form.items():
        options.append(seq(lit(head), chars([(c, c) for c in last])))
    return alt(*options) if options else Alt(())


def _intersect(a, b) -> list[tuple[int, int]]:
    out = []
    for lo, hi in a:
        for lo2, hi2 in b:
            x, y = max(lo, lo2), min(hi, hi2)
            if x <= y:
                out.append((x, y))
    return out


def encode(node: Node) -> Node:
    """Map a decoded-string node to the JSON-escaped form."""
    if isinstance(node, Lit):
        return lit("".join(escaped(ord(c)) for c in node.text))
    if isinstance(node, Chars):
        return encode_chars(node.ranges)
    if isinstance(node, Seq):
        return seq(*(encode(i) for i in node.items))
    if isinstance(node, Alt):
        return alt(*(encode(i) for i in node.items))
    if isinstance(node, Rep):
        return rep(encode(node.item), node.min, node.max)
    raise TypeError(node)


def string_content(pattern: str | None, min_len: int = 0, max_len: int | None = None) -> Node:
    """JSON-escaped content (no quotes) of strings matching `pattern` with the length bounds."""
    if pattern is None:
        return rep(encode_chars(ANY_CHAR), min_len, max_len)
    decoded = parse_pattern(pattern)
    if min_len or max_len is not None:
        constrained = constrain_length(decoded, min_len, max_len)
        if constrained is None:
            raise PatternNotSupported("pattern together with minLength/maxLength is not expressible")
        decoded = constrained
    return encode(decoded)


# ---------------------------------------------------------------- automata (for key languages)

MAX_DFA_STATES = 64
MAX_KEY_REGEX = 20_000  # characters of one key class's regex
MAX_NFA_STATES = 5_000


class _Nfa:
    def __init__(self):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[tuple, int]]] = []  # (ranges, target)
        self.tags: dict[int, set] = {}

    def state(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise PatternNotSupported("the key language is too large to analyse")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node: Node, start: int) -> int:
        """Add `node` from `start`; return its end state."""
        if isinstance(node, Lit):
            cur = start
            for c in node.text:
                nxt = self.state()
                self.edges[cur].append((((ord(c), ord(c)),), nxt))
                cur = nxt
            return cur
        if isinstance(node, Chars):
            end = self.state()
            self.edges[start].append((node.ranges, end))
            return end
        if isinstance(node, Seq):
            cur = start
            for item in node.items:
                cur = self.build(item, cur)
            return cur
        if isinstance(node, Alt):
            end = self.state()
            for item in node.items:
                branch = self.state()
                self.eps[start].append(branch)
                self.eps[self.build(item, branch)].append(end)
            return end
        if isinstance(node, Rep):
            cur = start
            for _ in range(node.min):
                cur = self.build(node.item, cur)
            if node.max is None:
                loop = self.state()
                self.eps[cur].append(loop)
                self.eps[self.build(node.item, loop)].append(loop)
                return loop
            end = self.state()
            self.eps[cur].append(end)
            for _ in range(node.max - node.min):
                cur = self.build(node.item, cur)
                self.eps[cur].append(end)
            return end
        raise TypeError(node)

    def closure(self, states) -> frozenset:
        seen, stack = set(states), list(states)
        while stack:
            for nxt in self.eps[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return frozenset(seen)


def _partition(nfa: _Nfa) -> list[tuple[int, int]]:
    cuts = {0, MAX_CODEPOINT + 1}
    for edges in nfa.edges:
        for ranges, _ in edges:
            for lo, hi in ranges:
                cuts.update((lo, hi + 1))
    points = sorted(cuts)
    return list(zip(points, [p - 1 for p in points[1:]], strict=False))


def classify_keys(languages: list[Node]) -> list[tuple[frozenset, Node]]:
    """Split all strings by which of the given decoded-string languages they belong to.

    Returns (indices of the languages a string is in, decoded-string IR of exactly those strings)
    for every non-empty class, including the class of strings in none of them (empty set).
    """
    nfa = _Nfa()
    start = nfa.state()
    for index, language in enumerate(languages):
        branch = nfa.state()
        nfa.eps[start].append(branch)
        nfa.tags.setdefault(nfa.build(language, branch), set()).add(index)
    symbols = _partition(nfa)
    initial = nfa.closure([start])
    states, transitions, todo = {initial: 0}, [], [initial]
    while todo:
        current = todo.pop()
        row: dict[int, int] = {}
        for k, (lo, hi) in enumerate(symbols):
            targets = [t for s in current for ranges, t in nfa.edges[s]
                       if any(a <= lo and hi <= b for a, b in ranges)]
            nxt = nfa.closure(targets)
            if nxt not in states:
                if len(states) >= MAX_DFA_STATES:
                    raise PatternNotSupported("the key language is too large to analyse")
                states[nxt] = len(states)
                todo.append(nxt)
            row[k] = states[nxt]
        transitions.append((states[current], row))
    table = dict(transitions)
    tag_of = {number: frozenset(i for s in subset for i in nfa.tags.get(s, ()))
              for subset, number in states.items()}
    classes = []
    for tags in sorted(set(tag_of.values()), key=sorted):
        finals = {n for n, t in tag_of.items() if t == tags}
        node = _eliminate(table, symbols, 0, finals)
        if node is not None:
            if _size(node) > MAX_KEY_REGEX:
                raise PatternNotSupported("the key language is too large to express")
            classes.append((tags, node))
    return classes


def _eliminate(table: dict[int, dict[int, int]], symbols, start: int, finals: set[int]) -> Node | None:
    """Regular expression (IR) of the DFA's language with the given final states (state elimination)."""
    # keep only states that reach a final state
    reverse: dict[int, set[int]] = {}
    for s, row in table.items():
        for t in row.values():
            reverse.setdefault(t, set()).add(s)
    alive, stack = set(finals), list(finals)
    while stack:
        for p in reverse.get(stack.pop(), ()):
            if p not in alive:
                alive.add(p)
                stack.append(p)
    if start not in alive:
        return None
    begin, end = -1, -2
    edges: dict[tuple[int, int], Node] = {(begin, start): EMPTY}
    for s, row in table.items():
        if s not in alive:
            continue
        grouped: dict[int, list[tuple[int, int]]] = {}
        for k, t in row.items():
            if t in alive:
                grouped.setdefault(t, []).append(symbols[k])
        for t, ranges in grouped.items():
            edges[(s, t)] = chars(ranges)
        if s in finals:
            edges[(s, end)] = EMPTY
    pending = sorted(alive, key=lambda q: sum(1 for (a, b) in edges if q in (a, b)))
    for q in pending:
        loop = edges.pop((q, q), None)
        ins = [(p, label) for (p, r), label in edges.items() if r == q]
        outs = [(r, label) for (p, r), label in edges.items() if p == q]
        for p, _ in ins:
            del edges[(p, q)]
        for r, _ in outs:
            del edges[(q, r)]
        middle = rep(loop, 0, None) if loop is not None else EMPTY
        for p, into in ins:
            for r, out in outs:
                path = seq(into, middle, out)
                edges[(p, r)] = alt(edges[(p, r)], path) if (p, r) in edges else path
    return edges.get((begin, end))


def _size(node: Node, budget: int = MAX_KEY_REGEX + 1) -> int:
    """Approximate printed size of a node, counting at most `budget`."""
    total, stack = 0, [node]
    while stack and total < budget:
        item = stack.pop()
        if isinstance(item, Lit):
            total += len(item.text) + 1
        elif isinstance(item, Chars):
            total += 4 + 8 * len(item.ranges)
        elif isinstance(item, Rep):
            total += 4
            stack.append(item.item)
        else:
            total += 4
            stack.extend(item.items)
    return total
