"""Does a grammar compile in llguidance and in xgrammar against a real tokenizer?

The checkers take an already loaded Hugging Face tokenizer (the caller loads it; this room does
not import transformers). llguidance reads the Lark rendering, xgrammar the EBNF rendering.
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
    def xgrammar_compiler(self):
        import xgrammar

        info = xgrammar.TokenizerInfo.from_huggingface(self.hf_tokenizer)
        return xgrammar.GrammarCompiler(info, cache_enabled=False)

    def llguidance_error(self, lark_text: str) -> str | None:
        """None when llguidance compiles the grammar and computes a first mask, else the error."""
        import llguidance

        try:
            grammar = llguidance.LLMatcher.grammar_from_lark(lark_text)
            matcher = llguidance.LLMatcher(self.llguidance_tokenizer, grammar)
        except Exception as exc:  # llguidance raises plain exceptions for bad grammars
            return str(exc)
        if matcher.is_error():
            return matcher.get_error()
        return None

    def llguidance_matcher(self, lark_text: str):
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_lark(lark_text)
        return llguidance.LLMatcher(self.llguidance_tokenizer, grammar)

    def xgrammar_error(self, gbnf_text: str) -> str | None:
        import xgrammar

        try:
            grammar = xgrammar.Grammar.from_ebnf(gbnf_text)
            self.xgrammar_compiler.compile_grammar(grammar)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses
            return str(exc)
        return None

    def xgrammar_accepts(self, gbnf_text: str, text: str) -> bool:
        import xgrammar

        compiled = self.xgrammar_compiler.compile_grammar(xgrammar.Grammar.from_ebnf(gbnf_text))
        matcher = xgrammar.GrammarMatcher(compiled, terminate_without_stop_token=True)
        return matcher.accept_string(text) and matcher.is_terminated()

    def llguidance_accepts(self, lark_text: str, text: str) -> bool:
        matcher = self.llguidance_matcher(lark_text)
        if matcher.is_error():
            return False
        tokens = self.hf_tokenizer.encode(text, add_special_tokens=False)
        for token in tokens:
            if not matcher.consume_token(token):
                return False
        return matcher.is_accepting()
