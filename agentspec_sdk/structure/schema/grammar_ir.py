"""A tiny grammar IR printed both as Lark (python lark and llguidance) and as xgrammar EBNF.

Nodes: `Lit` (literal text), `Chars` (a set of code points), `Seq`, `Alt`, `Rep` (bounded or not),
`Ref` (a named rule). Printing both renderings from one tree keeps them from drifting apart.

Dialect notes, measured on lark 1.2, llguidance 1.2 and xgrammar 0.2:
- llguidance rejects Lark's rule repetition `x ~ m..n`, python lark has no `x{m,n}` on rules, so
  bounded repetition of rules is expanded; inside terminals (regexes) `{m,n}` works in both.
- python lark decodes `\\xHH`/`\\uHHHH` in `/regex/` before `re` sees it, so regex metacharacters are
  escaped with a backslash, never with a hex code.
- `Tok` marks a lexical unit (a JSON string, a number, whitespace): it becomes one named Lark
  terminal (one regex), which llguidance lexes far faster than a rule over single characters.
  Structure (objects, arrays) stays in rules, so lexemes stay small. Adjacent literals are not
  merged: llguidance's lexer backtracks one byte at most, so a lexeme `,"tags":[` next to `,`
  would dead-end on `,"zz"`; JSON tokens as separate lexemes never overlap that way.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_CODEPOINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
MAX_EXPANDED_REPEAT = 2048


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Chars:
    ranges: tuple[tuple[int, int], ...]


class _CachedHash:
    """Deep trees are hashed often (deduplication): cache the hash on the instance."""

    def __hash__(self):
        try:
            return self._hash
        except AttributeError:
            value = hash((type(self).__name__, *(getattr(self, f) for f in self.__dataclass_fields__)))
            object.__setattr__(self, "_hash", value)
            return value


@dataclass(frozen=True, eq=True)
class Seq(_CachedHash):
    items: tuple
    __hash__ = _CachedHash.__hash__


@dataclass(frozen=True, eq=True)
class Alt(_CachedHash):
    items: tuple
    __hash__ = _CachedHash.__hash__


@dataclass(frozen=True, eq=True)
class Rep(_CachedHash):
    item: object
    min: int
    max: int | None
    __hash__ = _CachedHash.__hash__


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True, eq=True)
class Tok(_CachedHash):
    """A lexical unit (a JSON string, a number): printed as one Lark terminal."""

    item: object
    __hash__ = _CachedHash.__hash__


Node = Lit | Chars | Seq | Alt | Rep | Ref | Tok
EMPTY = Lit("")
NOTHING = Alt(())  # the empty language


def lit(text: str) -> Node:
    return Lit(text)


def chars(ranges) -> Node:
    """A character set from (lo, hi) ranges; surrogates are dropped, ranges merged."""
    cleaned = []
    for lo, hi in sorted(ranges):
        for a, b in _without_surrogates(lo, hi):
            if cleaned and a <= cleaned[-1][1] + 1:
                cleaned[-1] = (cleaned[-1][0], max(cleaned[-1][1], b))
            else:
                cleaned.append((a, b))
    if not cleaned:
        return NOTHING
    if len(cleaned) == 1 and cleaned[0][0] == cleaned[0][1]:
        return Lit(chr(cleaned[0][0]))
    return Chars(tuple(cleaned))


def _without_surrogates(lo: int, hi: int):
    s_lo, s_hi = SURROGATES
    if hi < s_lo or lo > s_hi:
        return [(lo, hi)] if lo <= hi else []
    parts = []
    if lo < s_lo:
        parts.append((lo, s_lo - 1))
    if hi > s_hi:
        parts.append((s_hi + 1, hi))
    return parts


def complement(ranges) -> list[tuple[int, int]]:
    out, nxt = [], 0
    for lo, hi in sorted(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return out


def seq(*items: Node) -> Node:
    flat: list = []
    for item in items:
        parts = item.items if isinstance(item, Seq) else (item,)
        for part in parts:
            if part == NOTHING:
                return NOTHING
            if part != EMPTY:
                flat.append(part)  # literals stay apart: one lexeme per JSON token (see module doc)
    if not flat:
        return EMPTY
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def alt(*items: Node) -> Node:
    flat: list = []
    seen = set()
    for item in items:
        for part in item.items if isinstance(item, Alt) else (item,):
            if part not in seen:
                seen.add(part)
                flat.append(part)
    if len(flat) == 1:
        return flat[0]
    return Alt(tuple(flat))


def opt(item: Node) -> Node:
    return rep(item, 0, 1)


def rep(item: Node, lo: int, hi: int | None) -> Node:
    if hi is not None and hi < lo:
        return NOTHING
    if hi == 0 or item == EMPTY:
        return EMPTY
    if item == NOTHING:
        return EMPTY if lo == 0 else NOTHING
    if lo == 1 and hi == 1:
        return item
    return Rep(item, lo, hi)


def tok(item: Node) -> Node:
    if item == NOTHING or item == EMPTY or isinstance(item, Lit | Tok):
        return item
    return Tok(item)


def nullable(node: Node, rules: dict[str, Node] | None = None, _seen=None) -> bool:
    if isinstance(node, Lit):
        return node.text == ""
    if isinstance(node, Chars):
        return False
    if isinstance(node, Rep):
        return node.min == 0 or nullable(node.item, rules, _seen)
    if isinstance(node, Tok):
        return nullable(node.item, rules, _seen)
    if isinstance(node, Seq):
        return all(nullable(i, rules, _seen) for i in node.items)
    if isinstance(node, Alt):
        return any(nullable(i, rules, _seen) for i in node.items)
    seen = _seen or set()
    if rules is None or node.name in seen:
        return False
    seen.add(node.name)
    return nullable(rules[node.name], rules, seen)


# ---------------------------------------------------------------- regex (inside Lark terminals)

_REGEX_META = set("\\.+*?()|[]{}^$#&-~")


def regex_char(cp: int, in_class: bool) -> str:
    """The code point `cp` as one character of a regex (inside a `[...]` class where `in_class`)."""
    c = chr(cp)
    if c == "/":
        return "\\/"
    if c == '"':
        return "\\x22"  # lark rewrites `\\"` to `"`: a quote after an escaped backslash is lost
    if c in _REGEX_META:
        return "\\" + c
    return _escaped_code(cp)


def _escaped_code(cp: int) -> str:
    """A control or non-ASCII code point as both dialects write it (\\xNN, \\uNNNN, \\UNNNNNNNN)."""
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02x}"
    if cp > 0x7E:
        return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"
    return chr(cp)


def _regex_class(ranges) -> str:
    parts = []
    for lo, hi in ranges:
        if lo == hi:
            parts.append(regex_char(lo, True))
        elif hi == lo + 1:
            parts.append(regex_char(lo, True) + regex_char(hi, True))
        else:
            parts.append(regex_char(lo, True) + "-" + regex_char(hi, True))
    return "[" + "".join(parts) + "]"


def _regex_quant(lo: int, hi: int | None) -> str:
    if (lo, hi) == (0, None):
        return "*"
    if (lo, hi) == (1, None):
        return "+"
    if (lo, hi) == (0, 1):
        return "?"
    if hi is None:
        return f"{{{lo},}}"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def to_regex(node: Node, atom: bool = False) -> str:
    """Regex text (python `re` and Rust `regex` common subset) for a lexical node."""
    if isinstance(node, Lit):
        text = "".join(regex_char(ord(c), False) for c in node.text)
        return f"(?:{text})" if atom and len(node.text) > 1 else text
    if isinstance(node, Chars):
        return _regex_class(node.ranges)
    if isinstance(node, Seq):
        text = "".join(to_regex(i, True) for i in node.items)
        return f"(?:{text})" if atom else text
    if isinstance(node, Alt):
        if not node.items:
            raise ValueError("empty alternative cannot be printed")
        options = [i for i in node.items if i != EMPTY]
        body = "(?:" + "|".join(to_regex(i) for i in options) + ")"
        # python `re` is leftmost-first: an empty option tried first would end the match early
        return body + "?" if len(options) < len(node.items) else body
    if isinstance(node, Rep):
        inner = to_regex(node.item, True)
        if isinstance(node.item, Rep | Tok):  # `x{2}{0,3}` is a "multiple repeat" error
            inner = f"(?:{inner})"
        return inner + _regex_quant(node.min, node.max)
    if isinstance(node, Tok):
        return to_regex(node.item, atom)
    raise TypeError(f"not lexical: {node!r}")


# ---------------------------------------------------------------- Lark printer


def _lark_string(text: str) -> str | None:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        return None
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _LarkPrinter:
    def __init__(self, terminal_prefix: str):
        self.terminal_prefix = terminal_prefix
        self.rule_prefix = terminal_prefix.lower() + "_rep"
        self.terminals: dict[Node, str] = {}
        self.helpers: dict[tuple[str, int], str] = {}
        self.helper_rules: list[str] = []

    def terminal(self, node: Node) -> str:
        if nullable(node):
            raise ValueError(f"a terminal cannot match the empty string: {node!r}")
        name = self.terminals.get(node)
        if name is None:
            name = f"{self.terminal_prefix}{len(self.terminals)}"
            self.terminals[node] = name
        return name

    def expr(self, node: Node) -> str:
        if isinstance(node, Lit):
            if node.text == "":
                raise ValueError("empty literal must be folded into an optional")
            literal = _lark_string(node.text)
            return literal if literal is not None else self.terminal(node)
        if isinstance(node, Tok):
            return self.terminal(node.item)
        if isinstance(node, Chars):
            return self.terminal(node)
        if isinstance(node, Ref):
            return node.name
        if isinstance(node, Seq):
            return " ".join(self.atom(i) for i in node.items)
        if isinstance(node, Alt):
            if not node.items:
                raise ValueError("empty language cannot be printed")
            options = [i for i in node.items if i != EMPTY]
            body = " | ".join(self.expr(i) for i in options)
            if len(options) < len(node.items):
                return f"({body})?" if len(options) > 1 else self.atom(options[0]) + "?"
            return body
        if isinstance(node, Rep):
            return self.repeat(node)
        raise ValueError(f"cannot print {node!r}")

    def atom(self, node: Node) -> str:
        """A symbol for `node` inside a sequence or repetition: compound parts become helper rules,
        since python lark multiplies out groups and optionals inside one rule (2^k expansions)."""
        text = self.expr(node)
        if isinstance(node, Lit | Ref | Tok | Chars):
            return text
        key = (text, -1)
        if key not in self.helpers:
            self.helpers[key] = f"{self.rule_prefix}{len(self.helpers)}"
            self.helper_rules.append(f"{self.helpers[key]}: {text}")
        return self.helpers[key]

    def repeat(self, node: Rep) -> str:
        item, lo, hi = node.item, node.min, node.max
        a = self.atom(item)
        if (lo, hi) == (0, None):
            return f"{a}*"
        if (lo, hi) == (1, None):
            return f"{a}+"
        if (lo, hi) == (0, 1):
            return f"{a}?"
        if (hi or lo) > MAX_EXPANDED_REPEAT:
            raise ValueError(f"repetition bound {hi or lo} is above {MAX_EXPANDED_REPEAT}")
        head = " ".join([a] * lo)
        if hi is None:
            tail = f"{a}*"
        else:
            tail = self.up_to(a, hi - lo)
        return f"{head} {tail}".strip()

    def up_to(self, a: str, count: int) -> str:
        """`a{0,count}` as O(log count) helper rules, unambiguous: pairs of `a`, then parity.

        Nested optionals nest too deep for llguidance and a chain of `count` rules is quadratic
        for python lark; with p = `a a`: a{0,2m+1} = p{0,m} a?, a{0,2m} = p{0,m} | p{0,m-1} a.
        """
        if count <= 3:
            tail = ""
            for _ in range(count):
                tail = f"({a} {tail})?" if tail else f"{a}?"
            return tail
        key = (a, count)
        if key not in self.helpers:
            name = self.helpers[key] = f"{self.rule_prefix}{len(self.helpers)}"
            pair_key = (a, -2)
            if pair_key not in self.helpers:
                self.helpers[pair_key] = f"{self.rule_prefix}{len(self.helpers)}"
                self.helper_rules.append(f"{self.helpers[pair_key]}: {a} {a}")
            pair = self.helpers[pair_key]
            half = count // 2
            if count % 2:
                body = f"{self.group(self.up_to(pair, half))} {a}?"
            else:
                body = f"{self.group(self.up_to(pair, half))} | {self.group(self.up_to(pair, half - 1))} {a}"
            self.helper_rules.append(f"{name}: {body}")
        return self.helpers[key]

    @staticmethod
    def group(text: str) -> str:
        return text if " " not in text else f"({text})"


def to_lark(rules: dict[str, Node], terminal_prefix: str) -> str:
    printer = _LarkPrinter(terminal_prefix)
    lines = [f"{name}: {printer.expr(body)}" for name, body in rules.items()]
    lines += printer.helper_rules
    done: set[str] = set()
    while len(done) < len(printer.terminals):
        for node, name in list(printer.terminals.items()):
            if name not in done:
                done.add(name)
                lines.append(f"{name}: /{to_regex(node)}/")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- xgrammar EBNF printer


def _gbnf_char(cp: int, in_class: bool) -> str:
    c = chr(cp)
    if c == "\\":
        return "\\\\"
    if in_class and c in "]-^[":
        return "\\" + c
    if not in_class and c == '"':
        return '\\"'
    return _escaped_code(cp)


def _gbnf_class(ranges) -> str:
    def item(lo, hi):
        return _gbnf_char(lo, True) if lo == hi else _gbnf_char(lo, True) + "-" + _gbnf_char(hi, True)

    if ranges[-1][1] == MAX_CODEPOINT:
        # most of Unicode: the negated form is shorter and cheaper for xgrammar
        gaps = [part for a, b in complement(ranges) for part in _without_surrogates(a, b)]
        if gaps:
            return "[^" + "".join(item(lo, hi) for lo, hi in gaps) + "]"
    return "[" + "".join(item(lo, hi) for lo, hi in ranges) + "]"


class _GbnfPrinter:
    """xgrammar EBNF; each `Tok` becomes one shared rule (named like its Lark terminal), which
    keeps xgrammar's per-position mask cache small."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.tokens: dict[Node, str] = {}

    def token(self, node: Node) -> str:
        name = self.tokens.get(node)
        if name is None:
            name = f"{self.prefix}{len(self.tokens)}"
            self.tokens[node] = name
        return name

    def expr(self, node: Node, top: bool = False) -> str:
        if isinstance(node, Lit):
            return '"' + "".join(_gbnf_char(ord(c), False) for c in node.text) + '"'
        if isinstance(node, Chars):
            return _gbnf_class(node.ranges)
        if isinstance(node, Ref):
            return node.name
        if isinstance(node, Tok):
            return self.token(node.item)
        if isinstance(node, Seq):
            text = " ".join(self.expr(i) for i in node.items)
            return text if top else f"({text})"
        if isinstance(node, Alt):
            if not node.items:
                raise ValueError("empty language cannot be printed")
            text = " | ".join(self.expr(i) for i in node.items)
            return text if top else f"({text})"
        if isinstance(node, Rep):
            inner = self.expr(node.item)
            if not isinstance(node.item, Ref | Chars | Lit | Tok | Seq | Alt):
                inner = f"({inner})"  # a repeated repetition: `x{2}{0,3}` does not parse
            return inner + _regex_quant(node.min, node.max)
        raise TypeError(f"cannot print {node!r}")


def to_gbnf(rules: dict[str, Node], token_prefix: str = "tok") -> str:
    printer = _GbnfPrinter(token_prefix)
    lines = [f"{name} ::= {printer.expr(body, top=True)}" for name, body in rules.items()]
    done: set[str] = set()
    while len(done) < len(printer.tokens):
        for node, name in list(printer.tokens.items()):
            if name not in done:
                done.add(name)
                lines.append(f"{name} ::= {printer.expr(node, top=True)}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- analysis


def productive_rules(rules: dict[str, Node]) -> set[str]:
    """Rules that derive at least one finite string (fixpoint)."""
    good: set[str] = set()

    def prod(node: Node) -> bool:
        if isinstance(node, Lit | Chars):
            return True
        if isinstance(node, Ref):
            return node.name in good
        if isinstance(node, Rep):
            return node.min == 0 or prod(node.item)
        if isinstance(node, Tok):
            return prod(node.item)
        if isinstance(node, Seq):
            return all(prod(i) for i in node.items)
        return any(prod(i) for i in node.items)

    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            if name not in good and prod(body):
                good.add(name)
                changed = True
    return good


def prune(node: Node, dead: set[str]) -> Node:
    """Replace references to unproductive rules by the empty language and simplify."""
    if isinstance(node, Ref):
        return NOTHING if node.name in dead else node
    if isinstance(node, Seq):
        return seq(*(prune(i, dead) for i in node.items))
    if isinstance(node, Alt):
        return alt(*(p for p in (prune(i, dead) for i in node.items) if p != NOTHING)) if node.items else node
    if isinstance(node, Rep):
        return rep(prune(node.item, dead), node.min, node.max)
    if isinstance(node, Tok):
        return tok(prune(node.item, dead))
    return node
