"""The plan the SDK hands to the in-vLLM proposer: formats, tools, tokenizer, law parameters and the
policy per segment kind. A deployment's settings only: the bench's ablation switches are
`drafting.lab.LabSwitches`, never written here.

It is a JSON file whose path is in the environment variable AGENTSPEC_PLAN, so it also reaches a
separately started `vllm serve`. The engine rewrites it when tools are registered after start; the
drafter notices through `PlanWatcher` (the file's bytes compared at most every `poll_s`). The fields
are checked by pydantic; a bad value raises `PlanError` naming the file and the key path.
docs/drafting.md says why each default is what it is.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentspec_sdk.drafting.lab import LAB_FIELDS
from agentspec_sdk.errors import AgentSpecError, PlanError
from agentspec_sdk.structure.formats import AgentFormat, get_format
from agentspec_sdk.structure.tools import ToolRegistry

__all__ = ["ALL_KINDS", "DEFAULT_PRIOR", "PLAN_ENV", "POLICIES", "DraftPlan", "KindPolicy", "KindRule",
           "PlanError", "PlanWatcher", "segment_kinds"]

PLAN_ENV = "AGENTSPEC_PLAN"
DEFAULT_PRIOR = {"S": 0.8, "R": 0.45, "F": 0.3}
POLICIES = ("structure", "trees", "off")
ALL_KINDS = "*"  # the `kinds` key for every segment kind the plan does not name


class KindPolicy(BaseModel):
    """How the drafter drafts in one segment kind; a knob left None takes the plan's global value."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    # structure: the structure drafter; trees: exactly vLLM's suffix proposer's draft; off: no draft
    policy: Literal["structure", "trees", "off"] = "structure"
    boundary: Literal["wall", "price"] | None = None
    lookup_min_chars: int | None = Field(None, ge=1)
    extend_factor: float | None = Field(None, ge=0)  # 0: no extension draft in this kind
    tree_spec_factor: float | None = Field(None, gt=0)  # vLLM's suffix_decoding_max_spec_factor
    tree_min_token_prob: float | None = Field(None, ge=0, le=1)  # vLLM's suffix_decoding_min_token_prob


class KindRule(BaseModel):
    """A kind's policy with every knob resolved against the plan (`DraftPlan.kind_rules`)."""

    model_config = ConfigDict(frozen=True)

    policy: Literal["structure", "trees", "off"]
    boundary: Literal["wall", "price"]
    lookup_min_chars: int
    extend_factor: float | None  # None: no extension draft
    tree_spec_factor: float
    tree_min_token_prob: float


class DraftPlan(BaseModel):
    """The draft plan (see the module doc). Build it with keywords, `from_dict` or `load`."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)

    formats: list[dict] = Field(default_factory=lambda: [get_format("tool_calls").to_dict()], min_length=1)
    tools: list[dict] = Field(default_factory=list)
    tokenizer: str | None = None
    turn_start: str | None = None  # text that opens the model's turn; None: from the chat template
    gamma_max: int = Field(8, ge=0, le=64)
    step_budget: int | None = Field(None, ge=0)  # draft tokens per step over all rows; None: no cap
    kappa: float = Field(1.0, ge=0)
    # verify cost of one extra token / one target pass, for one sequence; the prior when learn_delta
    delta: float = Field(0.04, ge=0)
    learn_delta: bool = True  # learn delta from the proposer's own step times (law.OnlineStepCost)
    d: float = Field(0.0, ge=0)  # drafter cost per drafted token / one target pass
    # growth of a drafted token's verify cost per 1k tokens of its row's context, in delta's units
    delta_ctx: float = Field(0.013, ge=0)
    # the context (tokens) delta holds at; None: each step's mean row context
    ctx_ref: int | None = Field(None, ge=0)
    prior_acceptance: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_PRIOR))
    # past the segment end: "wall" (a draft stops there) or "price" (the trees' tokens past it are
    # priced by their learned acceptance and sent where that pays)
    boundary: Literal["wall", "price"] = "price"
    records_path: str | None = None
    records_max_bytes: int | None = Field(None, ge=4096)  # rotate the records past this; None: 64 MiB
    lookup_min_chars: int = Field(3, ge=1)  # the shortest match a lookup continues
    lookup_min_chars_code: int = Field(6, ge=1)  # the same in segment kinds of content "code"
    # the suffix trees' two knobs (vLLM's suffix_decoding_max_spec_factor / _min_token_prob)
    suffix_max_spec_factor: float = Field(1.0, gt=0)
    suffix_min_token_prob: float = Field(0.1, ge=0, le=1)
    # the trees' draft at this larger spec factor, its tokens past the factor-1 draft a source of their
    # own ("extend"); None: none
    suffix_extend_factor: float | None = Field(2.0, gt=0)
    # per segment kind: "<format>.<kind>" (that format's kind), "<kind>" (the kind in every format
    # naming it) or "*" (every kind not named), the most specific key applying; absent: "structure"
    kinds: dict[str, KindPolicy] = Field(default_factory=dict)
    version: int = Field(0, ge=0)

    def __init__(self, **data: Any):
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise PlanError(_describe(exc, "plan")) from None

    def __setattr__(self, name: str, value: Any) -> None:
        """Validated; a value refused (by a field's rule or the whole plan's) leaves the old one."""
        old = self.__dict__.get(name)
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            if name in self.__dict__:
                self.__dict__[name] = old
            raise PlanError(_describe(exc, "plan")) from None

    @model_validator(mode="before")
    @classmethod
    def _lab_fields(cls, data: Any) -> Any:
        """Plan files written before the lab switches moved out carry them at their defaults: dropped.
        A value other than the default is an ablation, which a plan no longer holds."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        for name, default in LAB_FIELDS.items():
            if name in data:
                value = data.pop(name)
                if value != default or type(value) is not type(default):
                    raise ValueError(f"{name}={value!r} is a lab switch (drafting.lab.LabSwitches, "
                                     "passed by the bench), not a plan setting")
        return data

    @field_validator("formats", mode="before")
    @classmethod
    def _format_dicts(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [f.to_dict() if isinstance(f, AgentFormat) else get_format(f).to_dict()
                    if isinstance(f, str) else dict(f) if isinstance(f, Mapping) else f for f in value]
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _tool_dicts(cls, value: Any) -> Any:
        if isinstance(value, ToolRegistry):
            return value.openai_tools()
        if isinstance(value, list | tuple):
            return [dict(t) if isinstance(t, Mapping) else t for t in value]
        return value

    @field_validator("prior_acceptance")
    @classmethod
    def _probabilities(cls, value: dict[str, float]) -> dict[str, float]:
        for law_class, alpha in value.items():
            if not 0.0 <= alpha <= 1.0:
                raise ValueError(f"prior_acceptance[{law_class!r}] must be in [0, 1], got {alpha!r}")
        return value

    @model_validator(mode="after")
    def _objects(self) -> DraftPlan:
        """The formats and tools build, and every `kinds` key is a segment kind of the formats."""
        try:
            formats = self.agent_formats()
            self.registry()
        except AgentSpecError as exc:
            raise ValueError(str(exc)) from None
        known = segment_kinds(formats)
        by_format = {f.name: f.kind_names for f in formats}
        for key in self.kinds:
            if key == ALL_KINDS or key in known:
                continue
            owner = next((f for f in by_format if key.startswith(f"{f}.")), None)
            if owner is None and "." in key:
                raise ValueError(f"kinds.{key}: the plan has no format {key.split('.')[0]!r}; its formats: "
                                 f"{list(by_format)}")
            if owner is None:
                raise ValueError(f"kinds.{key}: no segment kind of the plan's formats is named {key!r}; "
                                 f"known: {[ALL_KINDS, *known]} (or '<format>.<kind>')")
            if key[len(owner) + 1:] not in by_format[owner]:
                raise ValueError(f"kinds.{key}: format {owner!r} has no segment kind "
                                 f"{key[len(owner) + 1:]!r}; its kinds: {list(by_format[owner])}")
        return self

    # -- derived objects ----------------------------------------------------------------------

    def agent_formats(self) -> list[AgentFormat]:
        return [AgentFormat.from_dict(f) for f in self.formats]

    def registry(self) -> ToolRegistry:
        return ToolRegistry(self.tools)

    def effective_step_budget(self) -> int | None:
        return self.step_budget

    def kind_rules(self) -> dict[tuple[str, str], KindRule]:
        """(format name, segment kind name) of every kind of the plan's formats -> its resolved rule
        (policy and knobs)."""
        return {(fmt.name, kind.name): self.kind_rule(kind.name, kind.content == "code", fmt.name)
                for fmt in self.agent_formats() for kind in fmt.kinds}

    def kind_policy(self, kind: str, fmt: str | None = None) -> KindPolicy:
        """The policy `kinds` gives segment kind `kind` of format `fmt`, most specific key first:
        "<fmt>.<kind>", then "<kind>", then "*"; none of them: structure with the plan's knobs."""
        kinds = self.kinds
        return ((kinds.get(f"{fmt}.{kind}") if fmt is not None else None) or kinds.get(kind)
                or kinds.get(ALL_KINDS) or KindPolicy())

    def kind_rule(self, kind: str, code: bool = False, fmt: str | None = None) -> KindRule:
        """Segment kind `kind`'s rule (of format `fmt`: `kind_policy`) with each knob it leaves None
        the plan's (`code`: a kind of content "code", whose lookups take `lookup_min_chars_code`)."""
        pol = self.kind_policy(kind, fmt)
        min_chars = self.lookup_min_chars_code if code else self.lookup_min_chars
        extend = self.suffix_extend_factor if pol.extend_factor is None else pol.extend_factor
        return KindRule(policy=pol.policy, boundary=pol.boundary or self.boundary,
                        lookup_min_chars=pol.lookup_min_chars or min_chars, extend_factor=extend or None,
                        tree_spec_factor=pol.tree_spec_factor or self.suffix_max_spec_factor,
                        tree_min_token_prob=(self.suffix_min_token_prob if pol.tree_min_token_prob is None
                                             else pol.tree_min_token_prob))

    def suffix_equivalent(self) -> tuple[float, float] | None:
        """(max_spec_factor, min_token_prob) of vLLM's suffix drafter where this plan drafts exactly
        as it does: policy "trees" in every kind of every format and in kinds no format names, all at
        the same tree knobs; None otherwise."""
        rules = [*self.kind_rules().values(), self.kind_rule("")]
        knobs = {(r.tree_spec_factor, r.tree_min_token_prob) for r in rules}
        if len(knobs) != 1 or any(r.policy != "trees" for r in rules):
            return None
        return knobs.pop()

    def merged(self, *, formats: Iterable[AgentFormat | str | Mapping] | None = None,
               tools: ToolRegistry | Iterable[Mapping] | None = None, **fields: Any) -> DraftPlan:
        """A deployment's plan on this one's settings (kinds, knobs, prices: a tuned plan): `formats`
        and `tools` added by name (a given definition replaces this plan's of that name; the given
        formats come first), `fields` in place, `version` kept."""
        data = self.to_dict()
        if formats is not None:
            given = DraftPlan._format_dicts(list(formats))
            names = {f.get("name") for f in given}
            data["formats"] = given + [f for f in data["formats"] if f.get("name") not in names]
        if tools is not None:
            given = DraftPlan._tool_dicts(tools if isinstance(tools, ToolRegistry) else list(tools))
            names = {t.get("function", {}).get("name") for t in given}
            kept = [t for t in data["tools"] if t.get("function", {}).get("name") not in names]
            data["tools"] = kept + given
        unknown = sorted(set(fields) - set(type(self).model_fields))
        if unknown:
            raise PlanError(f"plan: unknown fields {unknown}; known: {sorted(type(self).model_fields)}")
        return DraftPlan.from_dict({**data, **fields})

    @classmethod
    def of(cls, plan: DraftPlan | str | os.PathLike | None) -> DraftPlan:
        """A plan given as an object, a file (loaded) or None (the defaults)."""
        if plan is None:
            return cls()
        if isinstance(plan, DraftPlan):
            return plan
        if isinstance(plan, str | os.PathLike):
            return cls.load(plan)
        raise PlanError(f"plan must be a DraftPlan, a plan file's path or None, got {type(plan).__name__}")

    # -- file ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data["kinds"] = {k: v.model_dump(exclude_defaults=True) for k, v in self.kinds.items()}
        return data

    def digest(self) -> int:
        """The plan's content (its `version` aside) as a 48-bit number, exact in a float: replicas that
        read one plan file show one value on their /metrics (`agentspec:plan_digest`)."""
        import hashlib

        content = {k: v for k, v in self.to_dict().items() if k != "version"}
        text = json.dumps(content, sort_keys=True, ensure_ascii=False, default=str)
        return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:12], 16)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "plan") -> DraftPlan:
        """`source`: what an error names (the file)."""
        if not isinstance(data, Mapping):
            raise PlanError(f"{source}: a plan must be a JSON object, got {type(data).__name__}")
        unknown = set(data) - set(cls.model_fields) - set(LAB_FIELDS)
        if unknown:
            raise PlanError(f"{source}: unknown fields {sorted(unknown)}; known: {sorted(cls.model_fields)}")
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise PlanError(_describe(exc, source)) from None
        except PlanError as exc:
            raise PlanError(str(exc).replace("plan: ", f"{source}: ", 1)) from None

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (a reader never sees half a file) and bump `version`."""
        path = Path(path)
        self.version += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> DraftPlan:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise PlanError(f"cannot read plan file {path}: {exc}") from None
        return cls.parse(data, str(path))

    @classmethod
    def parse(cls, data: bytes, path: str) -> DraftPlan:
        """The plan in a plan file's bytes (`path`: what an error names)."""
        try:
            content = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PlanError(f"plan file {path} is not valid JSON: {exc}") from None
        return cls.from_dict(content, source=path)

    @classmethod
    def from_env(cls) -> DraftPlan:
        path = os.environ.get(PLAN_ENV)
        if not path:
            raise PlanError(f"environment variable {PLAN_ENV} is not set (it names the draft plan file)")
        return cls.load(path)


def segment_kinds(formats: Iterable[AgentFormat | str | Mapping]) -> list[str]:
    """The segment kind names of the given formats (each once, in the formats' order): the keys a
    plan's `kinds` may use besides "*"."""
    out: list[str] = []
    for f in formats:
        fmt = (f if isinstance(f, AgentFormat) else get_format(f) if isinstance(f, str)
               else AgentFormat.from_dict(f))
        out += [name for name in fmt.kind_names if name not in out]
    return out


def _describe(exc: ValidationError, source: str) -> str:
    """One line per error: "<source>: <key path>: <message>"."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{source}: {loc}: {msg}" if loc and not msg.startswith(f"{loc}:")
                     else f"{source}: {msg}")
    return "; ".join(lines)


class PlanWatcher:
    """Reloads a plan file when its content changes; checks at most every `poll_s` seconds.

    A change is noticed by the file's bytes (a digest), not its mtime: two writes within one tick of
    the file system's clock (a client adding a tool right after an operator's edit) leave one mtime
    and possibly one size, and the second would otherwise stay unseen until the next write."""

    def __init__(self, path: str | os.PathLike, poll_s: float = 0.5):
        self.path = Path(path)
        self.poll_s = poll_s
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise PlanError(f"cannot read plan file {path}: {exc}") from None
        self._digest = _digest(data)
        self._next = time.monotonic() + poll_s
        self.plan = DraftPlan.parse(data, str(self.path))

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError:
            return None

    def poll(self) -> DraftPlan | None:
        """The new plan if the file changed since the last load, else None. A bad file keeps the old."""
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.poll_s
        data = self._read()
        if data is None:
            return None
        digest = _digest(data)
        if digest == self._digest:
            return None
        self._digest = digest  # a bad file is parsed once, not at every poll
        try:
            plan = DraftPlan.parse(data, str(self.path))
        except PlanError:
            return None
        self.plan = plan
        return plan


def _digest(data: bytes) -> bytes:
    import hashlib

    return hashlib.blake2b(data, digest_size=16).digest()
