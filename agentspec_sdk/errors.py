"""Errors the SDK raises. Each names what is wrong (schema path, tool name, limit).

Every exception class the SDK defines lives here and is imported from here (`from agentspec_sdk.errors
import PlanError`), also by the modules that raise it; no other module is its home. Not here:
private control-flow exceptions, raised and caught inside one module and never seen by a caller
(`coverage.exactness._OutOfTime`, `replay.trace._Bad`, `backends.remote.remote_transport._StreamBroken`,
`agentspec_langgraph.middleware._TimedOut`); they stay with their module.
"""


class AgentSpecError(Exception):
    """Base class of every error the SDK raises on purpose."""


class SchemaNotSupported(AgentSpecError):
    """A JSON Schema uses something the grammar compiler cannot express.

    `pointer` is the JSON pointer (RFC 6901) of the offending keyword inside the schema.
    """

    def __init__(self, message: str, pointer: str = ""):
        self.pointer = pointer
        super().__init__(f"{message} (at {pointer or '/'})")


class InvalidSchema(SchemaNotSupported):
    """The schema itself is malformed (wrong keyword types, $ref to nowhere, no finite instance)."""


class ToolRegistryError(AgentSpecError):
    """Invalid, duplicate or unknown tool."""


class FormatError(AgentSpecError):
    """An agent format definition is inconsistent."""


class LawInputError(AgentSpecError, ValueError):
    """Parameters of the Draft Law are out of their domain."""


class TraceError(AgentSpecError):
    """A trace file is corrupt or truncated; the message names the file and line."""


class BackendError(AgentSpecError):
    """The engine or server failed in a way the caller can act on."""


class SandboxError(AgentSpecError):
    """The code sandbox cannot be set up (bad limits, no interpreter); code that fails inside it is
    an observation, not this error."""


class PromptTooLong(BackendError):
    """A turn's prompt plus its max_tokens does not fit the engine's max_model_len."""

    def __init__(self, prompt_tokens: int, max_tokens: int, limit: int):
        self.prompt_tokens, self.max_tokens, self.limit = prompt_tokens, max_tokens, limit
        super().__init__(f"prompt of {prompt_tokens} tokens + max_tokens {max_tokens} = "
                         f"{prompt_tokens + max_tokens} exceeds max_model_len {limit}")


class BoundNotExpressible(ValueError):
    """A numeric bound (`keyword`: minimum, maximum, ...) the number grammar cannot express (more
    than 40 decimals). Internal to the schema compiler, which turns it into `SchemaNotSupported`."""

    def __init__(self, message: str, keyword: str):
        self.keyword = keyword
        super().__init__(message)


class PatternNotSupported(ValueError):
    """A JSON Schema `pattern` the regex translator cannot express (lookaround, backreferences, ...).
    Internal to the schema compiler, which turns it into `SchemaNotSupported`."""


class TurnParseError(AgentSpecError, ValueError):
    """A model turn does not follow its format (malformed tool call JSON, missing name, …)."""


class PlanError(AgentSpecError):
    """The plan file is missing, unreadable or has a bad field (the message names it)."""


class MalformedResponse(BackendError):
    """The server answered, but a field the client needs is missing or has the wrong type."""


class BfclDataError(AgentSpecError):
    """bfcl-eval is missing, or a BFCL data file, category or class does not exist."""


class CaptureError(AgentSpecError):
    """A capture file is unreadable (no header, unknown version, a malformed line, a turn naming an
    unknown grammar or tools id), or a capture setting is out of range; the message names the file and
    line or the setting."""


class TuneError(AgentSpecError):
    """`agentspec tune` cannot tune on its input: too few episodes to split, an unknown agent format,
    a bad setting (the message names the file, line or option)."""
