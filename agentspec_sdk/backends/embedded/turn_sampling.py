"""A turn's sampling parameters for vLLM: its grammar (the turn grammar of its format, tools and
tool choice, or the caller's own), checked once with llguidance so that a bad grammar fails the
turn with the reason instead of failing inside vLLM. A turn grammar is built once per format, tool
set and tool choice: an agent's next turn with the same tools reuses it."""

from __future__ import annotations

from agentspec_sdk.backends.types import TurnRequest
from agentspec_sdk.errors import BackendError
from agentspec_sdk.structure.formats import AgentFormat
from agentspec_sdk.structure.tools import ToolRegistry
from agentspec_sdk.structure.turn_grammar import turn_grammar

__all__ = ["TurnSampling"]

MAX_CHECKED = 512  # grammars whose check result is kept, and turn grammars kept


class TurnSampling:
    def __init__(self) -> None:
        self._errors: dict[str, str] = {}
        # (format name, tools key, tool choice) -> (the format object, its turn grammar)
        self._grammars: dict[tuple[str, str, str], tuple[AgentFormat, str]] = {}

    def params(self, req: TurnRequest, fmt: AgentFormat, registry: ToolRegistry):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        grammar = req.grammar
        if grammar is None:
            grammar = self.turn_grammar(fmt, registry, req.tool_choice)
        structured = None
        if grammar:
            error = self.check(grammar)
            if error:
                raise BackendError(f"grammar failed to compile: {error}")
            structured = StructuredOutputsParams(grammar=grammar)
        return SamplingParams(temperature=req.temperature, max_tokens=req.max_tokens,
                              stop=list(fmt.stop) or None, structured_outputs=structured,
                              logprobs=req.logprobs, output_kind=RequestOutputKind.CUMULATIVE)

    def turn_grammar(self, fmt: AgentFormat, registry: ToolRegistry, tool_choice: str) -> str:
        """`structure.turn_grammar`'s text for the turn, built once per format, tools and choice (a
        format of the same name but another definition is a new format)."""
        key = (fmt.name, registry.key(), tool_choice)
        known = self._grammars.get(key)
        if known is None or known[0] is not fmt:
            if len(self._grammars) > MAX_CHECKED:
                self._grammars.clear()
            known = self._grammars[key] = (fmt, turn_grammar(fmt, registry, tool_choice=tool_choice))
        return known[1]

    def check(self, grammar: str) -> str:
        """llguidance's complaint about `grammar` ('' when it compiles); cached."""
        if grammar not in self._errors:
            import llguidance

            try:
                error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar))
            except Exception as exc:  # llguidance raises on some malformed inputs instead of reporting
                error = str(exc)
            if len(self._errors) > MAX_CHECKED:
                self._errors.clear()
            self._errors[grammar] = error.strip()
        return self._errors[grammar]
