"""Grammar for 20 BFCL tools (one tool call = {"name": <tool>, "arguments": <its schema>}):
time from JSON Schemas to the first token mask, in llguidance (Lark) and xgrammar (EBNF).

    python benchmarks/grammar_compile.py [--runs 15] [--tools 20]

Prints medians; the goal is <= 50 ms to the first mask in llguidance (schema compile included).
Tool arguments are closed objects by default (`closed=True`: no undeclared keys), as a tool-call
grammar should be; `--open` keeps JSON Schema's default (extra keys of any value allowed).
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import statistics
import time


def bfcl_tools(count: int) -> list[dict]:
    from agentspec_sdk.bfcl import normalise_bfcl_schema

    tools, seen = [], set()
    data = importlib.resources.files("bfcl_eval") / "data"
    for name in ("BFCL_v4_multiple.json", "BFCL_v4_live_multiple.json"):
        for line in (data / name).read_text(encoding="utf-8").splitlines():
            for fn in json.loads(line).get("function", []):
                if fn["name"] not in seen:
                    seen.add(fn["name"])
                    tools.append({"name": fn["name"], "parameters": normalise_bfcl_schema(fn["parameters"])})
                if len(tools) == count:
                    return tools
    return tools


def tool_call_grammars(tools: list[dict], closed: bool = True) -> tuple[str, str]:
    """Lark and EBNF texts of the union of tool calls (what the per-turn grammar embeds)."""
    from agentspec_sdk.structure.schema.algebra import canonical_literal
    from agentspec_sdk.structure.schema.compiler import schema_rules

    lark_rules, gbnf_rules, lark_calls, gbnf_calls = [], [], [], []
    for i, tool in enumerate(tools):
        rules = schema_rules(tool["parameters"], f"t{i}", closed=closed)
        name = json.dumps(canonical_literal(tool["name"]))
        lark_rules.append(f't{i}_call: "{{" "\\"name\\":" {name} "," "\\"arguments\\":" {rules.root} "}}"\n'
                          f'{rules.lark}')
        gbnf_rules.append(f't{i}_call ::= "{{" "\\"name\\":" {name} "," "\\"arguments\\":" '
                          f'{rules.root} "}}"\n{rules.gbnf}')
        lark_calls.append(f"t{i}_call")
        gbnf_calls.append(f"t{i}_call")
    lark = "start: " + " | ".join(lark_calls) + "\n" + "".join(lark_rules)
    gbnf = "root ::= " + " | ".join(gbnf_calls) + "\n" + "".join(gbnf_rules)
    return lark, gbnf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--tools", type=int, default=20)
    parser.add_argument("--open", action="store_true",
                        help="admit undeclared argument keys (JSON Schema's default)")
    args = parser.parse_args()

    import llguidance
    import llguidance.hf
    import llguidance.numpy
    import xgrammar
    from transformers import AutoTokenizer

    from agentspec_sdk.backends.model_bundle import resolve_model

    hf = AutoTokenizer.from_pretrained(str(resolve_model()))
    llg_tok = llguidance.hf.from_tokenizer(hf)
    xgr_info = xgrammar.TokenizerInfo.from_huggingface(hf)
    tools = bfcl_tools(args.tools)

    compile_ms, llg_ms, xgr_ms = [], [], []
    for run in range(args.runs + 1):  # the first run warms caches and is dropped
        t0 = time.perf_counter()
        lark_text, gbnf_text = tool_call_grammars(tools, closed=not args.open)
        t1 = time.perf_counter()
        matcher = llguidance.LLMatcher(llg_tok, llguidance.LLMatcher.grammar_from_lark(lark_text))
        mask = llguidance.numpy.allocate_token_bitmask(1, llg_tok.vocab_size)
        llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
        t2 = time.perf_counter()
        if matcher.is_error():
            raise SystemExit(f"llguidance rejected the grammar: {matcher.get_error()}")
        compiler = xgrammar.GrammarCompiler(xgr_info, cache_enabled=False)
        compiled = compiler.compile_grammar(xgrammar.Grammar.from_ebnf(gbnf_text))
        xmatcher = xgrammar.GrammarMatcher(compiled)
        xmask = xgrammar.allocate_token_bitmask(1, xgr_info.vocab_size)
        xmatcher.fill_next_token_bitmask(xmask)
        t3 = time.perf_counter()
        if run:
            compile_ms.append((t1 - t0) * 1e3)
            llg_ms.append((t2 - t1) * 1e3)
            xgr_ms.append((t3 - t2) * 1e3)

    med = statistics.median
    print(f"objects {'open (extra keys allowed)' if args.open else 'closed (no undeclared argument keys)'}")
    print(f"{len(tools)} BFCL tools, Lark {len(lark_text)} chars, EBNF {len(gbnf_text)} chars, "
          f"{args.runs} runs (median)")
    print(f"  schemas -> grammar text (python):         {med(compile_ms):7.1f} ms")
    print(f"  llguidance: grammar -> first mask:         {med(llg_ms):7.1f} ms")
    print(f"  xgrammar:   grammar -> first mask:         {med(xgr_ms):7.1f} ms")
    total = med([a + b for a, b in zip(compile_ms, llg_ms, strict=True)])
    print(f"  schemas -> first mask, llguidance total:   {total:7.1f} ms  "
          f"(goal <= 50 ms: {'met' if total <= 50 else 'MISSED'})")
    print(f"  schemas -> first mask, xgrammar total:     "
          f"{med([a + b for a, b in zip(compile_ms, xgr_ms, strict=True)]):7.1f} ms")


if __name__ == "__main__":
    main()
