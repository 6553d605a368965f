"""Does a grammar compile in llguidance and in xgrammar against a real tokenizer, and which
strings does each engine accept?

The checkers take an already loaded Hugging Face tokenizer (the caller loads it; this module does
not import transformers). llguidance reads the Lark rendering, xgrammar the EBNF rendering.

`Judges` holds one grammar under the three judges the tests and `agentspec coverage` ask:
python `lark` (Earley, the grammar's own semantics), llguidance (`LLMatcher` fed the tokenizer's
tokens: the language vLLM's `guidance` backend enforces, lexer included) and xgrammar (a
character-level pushdown matcher on the EBNF rendering). `next_bytes` compares the two engines'
masks after a prefix (the allowed next single-byte tokens): a lexer that commits to the wrong lexeme
shows up there before it rejects anything.
"""

from __future__ import annotations

from functools import cached_property


class GrammarChecker:
    def __init__(self, hf_tokenizer):
        self.hf_tokenizer = hf_tokenizer

    @cached_property
    def llguidance_tokenizer(self):
        import llguidance.hf

        return llguidance.hf.from_tokenizer(self.hf_tokenizer)

    @cached_property
    def xgrammar_info(self):
        import xgrammar

        return xgrammar.TokenizerInfo.from_huggingface(self.hf_tokenizer)

    @cached_property
    def xgrammar_compiler(self):
        import xgrammar

        return xgrammar.GrammarCompiler(self.xgrammar_info, cache_enabled=False)

    @cached_property
    def first_bytes(self):
        """numpy array: token id -> its first byte (0..255), 256 for end of text, -1 otherwise."""
        import numpy as np

        tokenizer = self.llguidance_tokenizer
        out = np.full(tokenizer.vocab_size, -1, dtype=np.int32)
        for t in range(tokenizer.vocab_size):
            if tokenizer.is_special_token(t):
                continue
            raw = tokenizer.decode_bytes([t])
            if raw:
                out[t] = raw[0]
        out[tokenizer.eos_token] = 256
        return out

    @cached_property
    def single_byte_tokens(self) -> list[int]:
        """Byte value -> the token that is exactly that byte, or -1 (byte-level vocabularies have
        nearly all 256)."""
        found = [-1] * 256
        tokenizer = self.llguidance_tokenizer
        for t in range(tokenizer.vocab_size):
            if not tokenizer.is_special_token(t):
                raw = tokenizer.decode_bytes([t])
                if len(raw) == 1 and found[raw[0]] < 0:
                    found[raw[0]] = t
        return found

    def mask_first_bytes(self, bits) -> frozenset[int]:
        """First bytes of the tokens a mask allows (numpy uint8 array, little-endian bit order)."""
        import numpy as np

        allowed = np.unpackbits(bits, bitorder="little")[: len(self.first_bytes)].astype(bool)
        return frozenset(int(b) for b in np.unique(self.first_bytes[allowed]) if b >= 0)

    def xgrammar_bits(self, matcher):
        """xgrammar's next-token bitmask as little-endian bytes (bit t: token t allowed)."""
        import xgrammar

        bitmask = xgrammar.allocate_token_bitmask(1, self.xgrammar_info.vocab_size)
        matcher.fill_next_token_bitmask(bitmask)
        return bitmask[0].numpy().view("uint8")

    def tokens_of(self, text: str) -> list[int] | None:
        """The tokenizer's tokens for `text`, or None when they do not spell it byte for byte
        (SmolLM2's vocabulary has no token for the bytes 0xF1 and 0xF2: code points U+40000 to
        U+BFFFF cannot be written, and the Hugging Face tokenizer silently drops them)."""
        tokens = self.hf_tokenizer.encode(text, add_special_tokens=False)
        if self.llguidance_tokenizer.decode_bytes(tokens) != text.encode("utf-8"):
            return None
        return tokens

    def judges(self, lark_text: str, gbnf_text: str) -> Judges:
        return Judges(self, lark_text, gbnf_text)


JUDGES = ("lark", "llguidance", "xgrammar")


class Judges:
    """One grammar (Lark and EBNF renderings of the same rules) under the three judges.

    `errors[name]` is None when that judge compiled the grammar, else its message; `verdicts`
    gives None for a judge that did not compile it (and llguidance None for a text the tokenizer
    cannot spell)."""

    def __init__(self, checker: GrammarChecker, lark_text: str, gbnf_text: str):
        import lark
        import llguidance
        import xgrammar

        self.checker = checker
        self.errors: dict[str, str | None] = dict.fromkeys(JUDGES)
        self.parser = self.llg = self.xg = None
        try:
            self.parser = lark.Lark(lark_text)
        except Exception as exc:  # lark raises GrammarError and friends
            self.errors["lark"] = f"{type(exc).__name__}: {exc}"
        try:
            grammar = llguidance.LLMatcher.grammar_from_lark(lark_text)
            matcher = llguidance.LLMatcher(checker.llguidance_tokenizer, grammar, log_level=0)
            if matcher.is_error():
                self.errors["llguidance"] = matcher.get_error()
            else:
                self.llg = matcher  # pristine: each check works on a copy (an error state is final)
        except Exception as exc:  # llguidance raises plain exceptions for bad grammars
            self.errors["llguidance"] = str(exc)
        try:
            compiled = checker.xgrammar_compiler.compile_grammar(xgrammar.Grammar.from_ebnf(gbnf_text))
            self.xg = xgrammar.GrammarMatcher(compiled, terminate_without_stop_token=True)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses
            self.errors["xgrammar"] = str(exc)

    def lark_accepts(self, text: str) -> bool | None:
        import lark

        if self.parser is None:
            return None
        try:
            self.parser.parse(text)
            return True
        except lark.exceptions.LarkError:
            return False

    def llguidance_accepts(self, text: str) -> bool | None:
        if self.llg is None:
            return None
        tokens = self.checker.tokens_of(text)
        if tokens is None:
            return None
        matcher = self.llg.deep_copy()
        return matcher.consume_tokens(tokens) and matcher.is_accepting()

    def xgrammar_accepts(self, text: str) -> bool | None:
        if self.xg is None:
            return None
        self.xg.reset()
        return self.xg.accept_string(text) and self.xg.is_terminated()

    def verdicts(self, text: str) -> dict[str, bool | None]:
        return {"lark": self.lark_accepts(text), "llguidance": self.llguidance_accepts(text),
                "xgrammar": self.xgrammar_accepts(text)}

    def next_bytes(self, prefix: str) -> dict[str, frozenset[int]] | None:
        """Bytes each engine allows next after `prefix`: the first bytes of the tokens its mask
        allows (256 stands for end of text; llguidance allows only the canonical token where bytes
        are forced, so single-byte tokens alone would not do), or None when an engine did not
        compile the grammar or rejects the prefix itself."""
        if self.llg is None or self.xg is None:
            return None
        tokens = self.checker.tokens_of(prefix)
        matcher = self.llg.deep_copy()
        if tokens is None or not matcher.consume_tokens(tokens):
            return None
        self.xg.reset()
        if not self.xg.accept_string(prefix):
            return None
        import numpy as np

        return {"llguidance": self.checker.mask_first_bytes(np.frombuffer(matcher.compute_bitmask(),
                                                                          dtype=np.uint8)),
                "xgrammar": self.checker.mask_first_bytes(self.checker.xgrammar_bits(self.xg))}
