"""BFCL tool-call prompts for benchmarks (the loader lives in `agentspec_sdk.bfcl`).

    python benchmarks/bfcl_prompts.py -n 16            # list the prompts a benchmark would use
"""

from __future__ import annotations

import argparse
import json

from agentspec_sdk.bfcl import DEFAULT_CATEGORIES, BfclPrompt, load_category, tool_call_prompts

__all__ = ["BfclPrompt", "DEFAULT_CATEGORIES", "load_category", "tool_call_prompts"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=16, help="number of prompts")
    ap.add_argument("--categories", default=",".join(DEFAULT_CATEGORIES))
    ap.add_argument("--json", action="store_true", help="print full prompts as JSON lines")
    args = ap.parse_args()
    for p in tool_call_prompts(args.n, tuple(args.categories.split(","))):
        if args.json:
            print(json.dumps({"id": p.id, "messages": p.messages, "tools": p.tools,
                              "ground_truth": p.ground_truth}))
        else:
            print(f"{p.id:28s} tools={len(p.tools)}  {p.messages[-1]['content'][:90]!r}")


if __name__ == "__main__":
    main()
