"""The four arms of the protocol as episodes, and the speculation modes as engine settings.

A  free prose: passages of the CPython reference (the stdlib's `pydoc_data.topics`, the text
   `help()` shows), explained in plain words; no grammar; format `prose` (one F segment).
B  schema tool calls: BFCL simple_python and multiple questions with their functions; per-turn
   grammar; temperature 0; one assistant turn.
C  long chain reasoning: BFCL simple_python questions that ask for a calculation, solved step by
   step in prose without tools (format tool_calls, reasoning segment = class R); no grammar.
D  agent replay: the recorded BFCL multi-turn traces (mixed S / R / F), one arm per agent format:
   `D` JSON tool calls, `D-react` the same BFCL episodes in ReAct (Thought / Action / Action Input),
   `D-code` a code agent on HumanEval tasks (reasoning, a code block run in the sandbox, <result>).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentspec_sdk import bfcl
from agentspec_sdk.drafting.lab import ABLATIONS
from agentspec_sdk.errors import TraceError
from agentspec_sdk.replay.trace import Episode, Turn, bundled_traces, check_formats, load_traces
from agentspec_sdk.structure.formats import AgentFormat, LawClass, SegmentKind, register_format

# The env kind's marker never occurs in text: the segmenter cannot build a scanner for a format
# without any marker, and the proposer's choice of a row's format counts open markers in the prompt
# after its other evidence (structure.format_detect.prompt_format), so a marker that prompts contain
# would claim rows of other formats.
PROSE_END = "<|end_of_prose|>"
PROSE = AgentFormat(name="prose", description="Answer in plain prose.", initial="prose",
                    kinds=(SegmentKind("prose", LawClass.F, "model"),
                           SegmentKind("after_prose", LawClass.F, "env", (PROSE_END,))),
                    stop=(PROSE_END,), turn_end=("<|im_end|>",))

MODES = {
    "off": {"speculation": "off"},
    "ngram": {"speculation": "ngram"},
    "suffix": {"speculation": "suffix"},
    # suffix with its two knobs tuned (SUFFIX_TUNED, or the plan's own pair): a stock peer like suffix
    "suffix-tuned": {"speculation": "suffix"},
    "structure": {"speculation": "structure"},
    # ablations: the structure drafter with one part off (drafting.lab.ABLATIONS, passed as the
    # engine's lab switches; docs/drafting.md, "Lab switches")
    "structure-no-budget": {"speculation": "structure", "lab": ABLATIONS["no_budget"]},
    "structure-no-isolation": {"speculation": "structure", "lab": ABLATIONS["no_isolation"]},
    "structure-rate-rule": {"speculation": "structure", "lab": ABLATIONS["rate_rule"]},
    "structure-uncalibrated": {"speculation": "structure", "lab": ABLATIONS["uncalibrated"]},
    "structure-no-suffix": {"speculation": "structure", "lab": ABLATIONS["no_suffix"]},
    # vLLM's draft_model method with the layer-truncated draft (`agentspec draft make`, made on first
    # use): alone, cut at segment ends (the ablation of mechanism 1), and the full hybrid
    "draft_model": {"speculation": "draft_model"},
    "draft_model+cut": {"speculation": "draft_model+cut"},
    "structure+draft_model": {"speculation": "structure+draft_model"},
}
MODEL_DRAFT_MODES = ("draft_model", "draft_model+cut", "structure+draft_model")
# (max_spec_factor, min_token_prob) of `suffix-tuned`: the best of benchmarks/offline_drafting.py's grid
# on the bundled tool_calls and code_agent traces (react: (4, 0.1); long_context: (2, 0.3);
# docs/experiments/2026-12-02-where-structure-loses-to-suffix.md)
SUFFIX_TUNED = (4.0, 0.3)
ARMS = ("A", "B", "C", "D", "D-react", "D-code")
FORMAT_ARMS = {"tool_calls": "D", "react": "D-react", "code_agent": "D-code"}  # arm D, one per format
_CALC = re.compile(r"\b(calculate|compute|how many|how much|what is the|find the)\b", re.I)


@dataclass
class Arm:
    name: str
    episodes: list[Episode]
    grammar: str | None  # None = the per-turn grammar; "" = none
    max_tokens: int
    max_steps: int | None  # None = as recorded
    max_segments: int | None = None  # user messages replayed per episode (None = all)
    tool_choice: str | None = None  # None: the agent policy (loop.tool_choice_policy); "call": one call
    fmt: str | None = None  # the format the caller means them to run in (`replay(fmt=)`); None: theirs


def ensure_prose_format() -> AgentFormat:
    return register_format(PROSE, replace_existing=True)


def _single(ep_id: str, source: dict, system: str, user: str, fmt: str, tools: list[dict]) -> Episode:
    return Episode(id=ep_id, source=source, system=system, tools=tools, format=fmt,
                   turns=[Turn("user", user)])


def arm_a(n: int, max_chars: int = 900) -> list[Episode]:
    import pydoc_data.topics as topics

    ensure_prose_format()
    keys = sorted(topics.topics)
    if n > len(keys):
        raise TraceError(f"arm A has {len(keys)} passages, asked for {n}")
    step = max(1, len(keys) // n)
    out = []
    for key in keys[::step][:n]:
        passage = topics.topics[key].strip()[:max_chars]
        out.append(_single(f"A/{key}", {"name": "pydoc_data.topics", "topic": key, "license": "PSF-2.0"},
                           "You are a helpful assistant who explains technical text in plain words.",
                           "Explain this passage from the Python documentation in your own "
                           f"words:\n\n{passage}",
                           PROSE.name, []))
    return out


def _multi_turn_tool_names() -> set[str]:
    return {doc["name"] for cls in bfcl.CLASS_DOCS for doc in bfcl.class_docs(cls)}


def arm_b(n: int) -> list[Episode]:
    """The engine keeps one schema per tool name, so entries whose functions reuse a name with
    another schema (within the arm, or a multi-turn tool of arm D) are skipped."""
    simple, multiple = bfcl.read_jsonl("BFCL_v4_simple_python.json"), bfcl.read_jsonl("BFCL_v4_multiple.json")
    entries = [e for pair in zip(simple, multiple, strict=False) for e in pair]  # alternate the two files
    taken = dict.fromkeys(_multi_turn_tool_names())
    out = []
    for e in entries:
        if len(out) >= n:
            break
        tools = [bfcl.openai_tool(f) for f in e["function"]]
        if any(t["function"]["name"] in taken and taken[t["function"]["name"]] != t["function"]["parameters"]
               for t in tools):
            continue
        taken.update({t["function"]["name"]: t["function"]["parameters"] for t in tools})
        question = "\n".join(m["content"] for m in e["question"][0] if m["role"] == "user")
        out.append(_single(f"B/{e['id']}", {"name": "bfcl", "entry_id": e["id"], "license": bfcl.LICENSE},
                           bfcl.system_prompt(), question, "tool_calls", tools))
    return out


def arm_c(n: int) -> list[Episode]:
    entries = [e for e in bfcl.read_jsonl("BFCL_v4_simple_python.json")
               if _CALC.search(e["question"][0][0]["content"])]
    out = []
    for e in entries[:n]:
        out.append(_single(f"C/{e['id']}", {"name": "bfcl", "entry_id": e["id"], "license": bfcl.LICENSE},
                           "Solve the problem by reasoning step by step: write out every step and every "
                           "intermediate calculation, then state the final answer.",
                           e["question"][0][0]["content"], "tool_calls", []))
    return out


def arm_d(n: int | None = None, path=None) -> list[Episode]:
    """The episodes of a trace file, all in one agent format (`check_formats`: a mixed file is a
    TraceError, its arm would report one format's figures over several)."""
    episodes = load_traces(path or bundled_traces(), limit=n)
    check_formats(episodes)
    return episodes


def build_arm(name: str, n: int, *, max_tokens: int, trace_path=None, max_segments: int | None = None) -> Arm:
    if name == "A":
        return Arm("A", arm_a(n), "", max_tokens, 1)
    if name == "B":
        return Arm("B", arm_b(n), None, max_tokens, 1, tool_choice="call")
    if name == "C":
        return Arm("C", arm_c(n), "", max_tokens, 1)
    if name == "D":
        return Arm("D", arm_d(n, trace_path), None, max_tokens, None, max_segments)
    if name in ("D-react", "D-code"):
        fmt = next(f for f, a in FORMAT_ARMS.items() if a == name)
        return Arm(name, arm_d(n, trace_path or bundled_traces(fmt)), None, max_tokens, None, max_segments)
    raise TraceError(f"unknown arm {name!r}; arms are {list(ARMS)}")


def format_arms(formats: list[str]) -> list[str]:
    """Arm-D names for agent formats (tool_calls → D, react → D-react, code_agent → D-code)."""
    unknown = [f for f in formats if f not in FORMAT_ARMS]
    if unknown or not formats:
        raise TraceError(f"unknown agent format(s) {unknown} for arm D; formats are {list(FORMAT_ARMS)}")
    return [FORMAT_ARMS[f] for f in formats]


def engine_kwargs(mode: str, gamma: int, suffix_tuned: tuple[float, float] = SUFFIX_TUNED) -> dict:
    """Engine settings of a bench mode at draft length cap `gamma`; `suffix_tuned`: the
    (max_spec_factor, min_token_prob) pair of the `suffix-tuned` mode."""
    if mode not in MODES:
        raise TraceError(f"unknown mode {mode!r}; modes are {list(MODES)}")
    kw = dict(MODES[mode])
    if kw["speculation"] != "off":
        kw["gamma_max"] = gamma
    if mode in MODEL_DRAFT_MODES:
        from agentspec_sdk.backends.serving.draft_models import default_draft

        kw["draft_model"] = str(default_draft())
    if mode == "suffix-tuned":
        kw["suffix_max_spec_factor"], kw["suffix_min_token_prob"] = (float(x) for x in suffix_tuned)
    return kw
