"""vLLM's llguidance grammars, patched: exact masks under speculative decoding (a workaround for
llguidance's masks after a rollback) and token slices that make masks in free text cheap.

vLLM builds a speculative step's grammar masks by walking the request's llguidance matcher over the
draft (`StructuredOutputManager.grammar_bitmask`: fill the mask, accept the draft token, ... then
`rollback` the walk). llguidance (1.7.6 as vLLM 0.32 pins it; 1.8.0 and 1.9.1 the same) keeps
something of a mask computed during such a walk past its rollback: a later mask, in another parser
state that reaches the same lexer state, can allow tokens the grammar forbids. Measured on the
long_context traces (BFCL, 18 file-system tools): after `<tool_call>{"name":"c` a draft
`p","arguments":{"source":"` (the tool `cp`) was walked and rolled back; the model wrote `d` and the
`cd` call up to `"folder":"Annual_Report_2023.docx`, where the mask then allowed `","` (cd has no
second argument). The target took it, the matcher refused it, and vLLM ended the request with an
error: a speculative output that differs from `off` (docs/engine.md, "Requests and grammars";
docs/drafting.md, "The long_context traces in the engine, and exact grammar masks").
Every drafter can walk such a draft; structure's lookups made this one.

The workaround: a mask is filled from a copy of the matcher (`LLMatcher.deep_copy`, ≈ 1 µs here), so
the request's own matcher only accepts, validates and rolls back, which llguidance does exactly.
Token slices (`patch_slices`): vLLM builds its llguidance tokenizer with llguidance's own slices
(JSON string contents). A mask in a turn grammar's free text (a thought, a code body) then walks the
whole vocabulary, 0.29 ms with SmolLM2's 49k tokens, once per draft position and row every pass; with
`structure.marker_free.token_slices` (the same slices, first without the markers' delimiters) and
the turn grammar's plain-regex lexemes it takes 5 µs. The masks are the same.

Both are installed in every vLLM process an AgentSpec engine or `agentspec serve` starts: in-process
by `vllm_start`, in vLLM's own processes by the `vllm.general_plugins` entry point `register`, which is
inert unless `EXACT_MASKS_ENV` is "1" (our starts set it), so other vLLM users in the environment are
left alone.
"""

from __future__ import annotations

import functools
import logging
import os

from agentspec_sdk.errors import BackendError

__all__ = ["EXACT_MASKS_ENV", "register", "patch_guidance", "patch_slices"]

log = logging.getLogger("agentspec.backends")

EXACT_MASKS_ENV = "AGENTSPEC_EXACT_MASKS"
_PATCHED = "_agentspec_exact_masks"
_PATCHED_SLICES = "_agentspec_token_slices"


def register() -> None:
    """The entry point: patch vLLM's llguidance grammar and tokenizer when EXACT_MASKS_ENV is "1";
    else nothing."""
    if os.environ.get(EXACT_MASKS_ENV) == "1":
        patch_guidance()
        patch_slices()


def patch_guidance(grammar_cls=None) -> None:
    """Make `GuidanceGrammar.fill_bitmask` fill from a copy of the request's matcher (idempotent);
    BackendError naming the vLLM version when the class is not laid out as in vLLM 0.32."""
    if grammar_cls is None:
        from vllm.v1.structured_output.backend_guidance import GuidanceGrammar as grammar_cls
    fill = getattr(grammar_cls, "fill_bitmask", None)
    if fill is None or "ll_matcher" not in getattr(grammar_cls, "__dataclass_fields__", {}):
        raise BackendError(f"vLLM {_vllm_version()}: {grammar_cls.__name__} has no fill_bitmask / "
                           "ll_matcher; the exact-mask workaround cannot hook it")
    if getattr(fill, _PATCHED, False):
        return
    import llguidance.torch as llguidance_torch

    @functools.wraps(fill)
    def fill_bitmask(self, bitmask, idx: int) -> None:
        # a copy: the matcher that accepts and rolls back never computes a mask (module docstring)
        llguidance_torch.fill_next_token_bitmask(self.ll_matcher.deep_copy(), bitmask, idx)
        self.check_error()

    setattr(fill_bitmask, _PATCHED, True)
    grammar_cls.fill_bitmask = fill_bitmask
    log.info("vLLM's llguidance masks are filled from a copy of each matcher (exact after rollbacks)")


def patch_slices(backend_cls=None) -> None:
    """Make vLLM's `GuidanceBackend` give its llguidance tokenizer `token_slices` for the markers of
    every registered format (idempotent). A vLLM without the hook keeps llguidance's slices: masks
    stay exact, only slower, so that is logged, not raised."""
    if backend_cls is None:
        from vllm.v1.structured_output.backend_guidance import GuidanceBackend as backend_cls
    build = getattr(backend_cls, "_build_ll_tokenizer", None)
    if build is None:
        log.warning("vLLM %s: GuidanceBackend has no _build_ll_tokenizer; llguidance keeps its own "
                    "token slices (masks in free text walk the vocabulary)", _vllm_version())
        return
    if getattr(build, _PATCHED_SLICES, False):
        return

    @functools.wraps(build)
    def build_ll_tokenizer(tokenizer, vocab_size):
        return with_marker_slices(build(tokenizer, vocab_size))

    setattr(build_ll_tokenizer, _PATCHED_SLICES, True)
    backend_cls._build_ll_tokenizer = staticmethod(build_ll_tokenizer)
    log.info("vLLM's llguidance tokenizer gets token slices for marker-free text")


def with_marker_slices(ll_tokenizer):
    """`ll_tokenizer` with `token_slices` for the markers of every registered format."""
    from agentspec_sdk.structure.formats import format_names, get_format
    from agentspec_sdk.structure.marker_free import token_slices

    markers = [m for name in format_names() for kind in get_format(name).kinds
               for m in (*kind.open, *kind.close)]
    return ll_tokenizer.with_slices(token_slices(markers))


def _vllm_version() -> str:
    try:
        import vllm

        return vllm.__version__
    except Exception:  # pragma: no cover - vLLM absent
        return "?"
