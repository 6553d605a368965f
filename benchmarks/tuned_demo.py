"""The demo with `structure-tuned` and `suffix-tuned` tuned on turns the demo does not replay.

The demo replays the first episodes of each bundled trace file (D 6, D-react 2, D-code 2) and 4 arm-A
prose passages. This script captures the `off` run of the bundled episodes after those and of arm-A
passages the demo does not replay (`agentspec replay --capture`), tunes on that capture (`agentspec
tune`: the plan, per format and kind, and suffix-tuned's knobs, chosen on the capture's fitting part),
then runs the demo with both tuned rows beside the stock drafters and structure as it ships: no row is
scored on the turns it was tuned on.

  flock /tmp/agentspec-engine.lock python benchmarks/tuned_demo.py --work tuned-demo
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from agentspec_sdk.drafting.plan import DraftPlan
from agentspec_sdk.replay.arms import PROSE, arm_a
from agentspec_sdk.replay.cli import DEMO_EPISODES, DEMO_PROSE
from agentspec_sdk.replay.trace import bundled_traces, dump_traces
from agentspec_sdk.structure.formats import CODE_AGENT, REACT, TOOL_CALLS

AGENTSPEC = [sys.executable, "-m", "agentspec_sdk.cli"]
FORMATS = {"D": "tool_calls", "D-react": "react", "D-code": "code_agent"}
PROSE_TUNING = 8  # arm-A passages captured for tuning, none of them the demo's


def run(cmd: list[str]) -> None:
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def tuning_traces(work: Path) -> list[Path]:
    """Per agent format, the bundled episodes the demo does not replay, as a trace file of their own."""
    out = []
    for arm, fmt in FORMATS.items():
        lines = bundled_traces(fmt).read_text(encoding="utf-8").splitlines(keepends=True)
        rest = lines[DEMO_EPISODES[False][arm]:]
        path = work / f"tuning-{fmt}.jsonl"
        path.write_text("".join(rest), encoding="utf-8")
        out.append(path)
    return out


def prose_trace(work: Path, n: int = PROSE_TUNING) -> Path:
    """`n` arm-A prose passages the demo does not replay (evenly spread over the rest), as a trace file."""
    import pydoc_data.topics as topics

    shown = {e.id for e in arm_a(DEMO_PROSE[False])}
    rest = [e for e in arm_a(len(topics.topics)) if e.id not in shown]
    step = max(1, len(rest) // n)
    path = work / "tuning-prose.jsonl"
    dump_traces(rest[step // 2::step][:n], path)
    return path


def base_plan(work: Path) -> Path:
    """The formats `agentspec tune` needs beside the built-in ones (arm A's prose), in the engines'
    order (prose first: its prompts mention no marker, and format detection's ties go to the first)."""
    return DraftPlan(formats=[PROSE, REACT, TOOL_CALLS, CODE_AGENT]).save(work / "base-plan.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("tuned-demo"))
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--delta", type=float, default=0.2, help="agentspec tune --delta")
    args = ap.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    capture = work / "capture"
    for traces in [*tuning_traces(work), prose_trace(work)]:
        run([*AGENTSPEC, "replay", str(traces), "--modes", "off", "--max-tokens", "128", "--batch",
             str(args.batch), "--capture", str(capture), "--out", str(work / f"replay-{traces.stem}")])
    plan, report = work / "tuned.json", work / "tune-report"
    run([*AGENTSPEC, "tune", str(capture), "--out", str(plan), "--report", str(report), "--gamma",
         str(args.gamma), "--batch", str(args.batch), "--delta", str(args.delta), "--base-plan",
         str(base_plan(work))])
    knobs = json.loads((report / "report.json").read_text())["suffix_tuned_knobs"]
    pair = f"{knobs['max_spec_factor']},{knobs['min_token_prob']}"
    run([*AGENTSPEC, "demo", "--out", str(work / "demo"), "--gamma", str(args.gamma), "--batch",
         str(args.batch), "--plan", str(plan), "--suffix-tuned", pair,
         "--modes", "off,ngram,suffix,suffix-tuned,structure,structure-tuned"])


if __name__ == "__main__":
    main()
