"""Captured turns as the offline replay reads them, grouped into episodes and split into a fitting and
a held-out part (whole episodes only, a fixed seed).

An episode is the capture's `episode` key where the client gave one; a turn without a key is linked to
the earlier turn whose prompt its prompt extends (`simulate.predecessors`), so a conversation's turns
form one episode either way.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agentspec_sdk.backends.capture import Capture
from agentspec_sdk.errors import FormatError, TuneError
from agentspec_sdk.structure.formats import AgentFormat, format_names, get_format
from agentspec_sdk.tuning.simulate import predecessors
from agentspec_sdk.tuning.trim import TRIMMED_KINDS

__all__ = ["DEFAULT_FORMAT", "TurnSet", "episodes_of", "split_episodes", "turn_set"]

DEFAULT_FORMAT = "tool_calls"  # the format of turns captured without one (the plan's default format)


@dataclass
class TurnSet:
    """`turns`: one dict per captured turn (prompt, out, grammar index or None, fmt, episode, source);
    `grammars`: the distinct (kind, text) grammars; `tools`: the distinct tool dicts; `formats`: the
    agent formats the turns use, by name; `notes`: what the report must say about the input."""

    turns: list[dict]
    grammars: list[tuple[str, str]] = field(default_factory=list)
    tools: list[dict] = field(default_factory=list)
    formats: dict[str, AgentFormat] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def subset(self, indices: Sequence[int]) -> TurnSet:
        return TurnSet([self.turns[i] for i in indices], self.grammars, self.tools, self.formats, self.notes)

    @property
    def tokens(self) -> int:
        """Output tokens after each turn's first (the first comes with the prefill pass)."""
        return sum(max(len(t["out"]) - 1, 0) for t in self.turns)


def _format(name: str | None, known: Mapping[str, AgentFormat], where: str) -> AgentFormat:
    name = name or DEFAULT_FORMAT
    if name in known:
        return known[name]
    try:
        return get_format(name)
    except FormatError:
        names = sorted(set(known) | set(format_names()))
        raise TuneError(f"{where}: unknown agent format {name!r}; known: {names} (give a --base-plan whose "
                        "formats include it)") from None


def turn_set(capture: Capture, known_formats: Sequence[AgentFormat] = ()) -> TurnSet:
    """The capture's turns for the replay; `known_formats`: formats beyond the built-in ones (a base
    plan's), by name. Turns without a grammar, or with one the trim cannot read, are replayed
    untrimmed and counted in the notes."""
    known = {f.name: f for f in known_formats}
    out = TurnSet([], notes=list(capture.notes))
    grammar_index: dict[tuple[str, str], int] = {}
    tool_keys: set[str] = set()
    no_grammar = unreadable = no_format = 0
    for t in capture.turns:
        fmt = _format(t.format, known, t.source)
        out.formats.setdefault(fmt.name, fmt)
        no_format += t.format is None
        grammar = None
        if t.grammar is None:
            no_grammar += 1
        elif t.grammar.kind not in TRIMMED_KINDS:
            unreadable += 1
        else:
            grammar = grammar_index.setdefault((t.grammar.kind, t.grammar.text), len(grammar_index))
        for tool in t.tools or []:
            key = repr(sorted(tool.items()))
            if key not in tool_keys:
                tool_keys.add(key)
                out.tools.append(tool)
        out.turns.append({"prompt": list(t.prompt), "out": list(t.out), "grammar": grammar, "fmt": fmt.name,
                          "episode": t.episode, "source": t.source})
    out.grammars = list(grammar_index)
    if not out.turns:
        raise TuneError(f"no turns in the capture ({', '.join(capture.files) or 'no files'})")
    if no_grammar:
        out.notes.append(f"{no_grammar} of {len(out.turns)} turns have no grammar: replayed untrimmed "
                         "(their drafts are verified whole, as vLLM does without structured outputs)")
    if unreadable:
        out.notes.append(f"{unreadable} turns have a grammar kind the replay cannot read (e.g. "
                         "structural_tag): replayed untrimmed")
    if no_format:
        out.notes.append(f"{no_format} turns name no agent format: segmented as {DEFAULT_FORMAT!r}")
    return out


def episodes_of(turns: list[dict]) -> list[int]:
    """The episode number of each turn: its `episode` key, else the episode of the turn its prompt
    extends (`predecessors`), else a new one."""
    pred = predecessors(turns)
    numbers: dict = {}
    out: list[int] = []
    for j, t in enumerate(turns):
        if t.get("episode") is not None:
            out.append(numbers.setdefault(("key", t["episode"]), len(numbers)))
        elif pred[j] is not None:
            out.append(out[pred[j]])
        else:
            out.append(numbers.setdefault(("turn", j), len(numbers)))
    return out


def split_episodes(turns: list[dict], holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """(fitting turn indices, held-out turn indices): a `holdout` share of the episodes (at least one,
    at most all but one) drawn with `seed`, each episode wholly on one side; indices in capture order."""
    if not 0.0 < holdout < 1.0:
        raise TuneError(f"--holdout must be in (0, 1), got {holdout}")
    episode = episodes_of(turns)
    ids = sorted(set(episode))
    if len(ids) < 2:
        raise TuneError(f"{len(turns)} turns form {len(ids)} episode: tuning needs at least 2 episodes to "
                        "fit on one part and report on the other")
    random.Random(seed).shuffle(ids)
    n_held = min(max(round(holdout * len(ids)), 1), len(ids) - 1)
    held = set(ids[:n_held])
    fit = [j for j, e in enumerate(episode) if e not in held]
    return fit, [j for j, e in enumerate(episode) if e in held]
