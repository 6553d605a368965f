"""Tuning on captured traffic (`agentspec tune`): captured turns replayed offline (no engine) through
vLLM's stock drafters and the structure drafter under per-segment-kind policies, a policy chosen per
kind on one part of the episodes and reported on the other, the Draft Law's decision per class, and
the plan that comes out.

Modules, one job each: `simulate` (greedy verification simulated against recorded outputs),
`trim` (drafts trimmed by the request grammar, as vLLM does), `labels` (law class and segment kind per
output token), `episodes` (captured turns for the replay, episodes, the fitting / held-out split),
`candidates` (the drafters and policies replayed), `replays` (replays in worker processes), `choose`
(the per-kind choice, the best stock drafter), `decisions` (the law per class), `tuner` (all of it, and
the plan), `report` (markdown, JSON, plot), `cli` (`agentspec tune`).

May import backends (the capture reader, vLLM's peers in `backends.offline_peers`), drafting, structure,
law and errors; replay may build on it (the bench's `structure-tuned` row), so it imports no replay.
Imports nothing itself.
"""

__all__ = ["candidates", "choose", "cli", "decisions", "episodes", "labels", "replays", "report", "simulate",
           "tuner", "trim"]
