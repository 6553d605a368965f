"""`agentspec serve` with a native tool-call format (`--formats F --tool-format F`): a real vLLM server on
127.0.0.1 (SmolLM2, structure speculation), a plain OpenAI client: the request's grammar is the family's
own syntax, the `agentspec` tool parser returns OpenAI `tool_calls`, and an earlier call in the history
goes through the chat template in that syntax."""

import json

import pytest

from agentspec_sdk.backends.serving.server import ServerProcess, ServerSpec

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "celsius": {"type": "boolean"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current time in a time zone",
        "parameters": {"type": "object", "required": ["tz"],
                       "properties": {"tz": {"type": "string", "enum": ["UTC", "CET", "JST"]}}}}},
]
ASK = [{"role": "system", "content": "You are a helpful assistant. Call the tools you need."},
       {"role": "user", "content": "What is the weather in Paris? And what time is it in JST?"}]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=["hermes", "pythonic"])
def served(request, tmp_path_factory):
    from agentspec_sdk.backends.inside_vllm.tool_prompt import write_chat_template
    from agentspec_sdk.backends.model_bundle import resolve_model
    from agentspec_sdk.backends.serving.serve_cli import tool_format_of, write_plan

    name = request.param
    work = tmp_path_factory.mktemp(f"served-{name}")
    (work / "tools.json").write_text(json.dumps(TOOLS))
    model = resolve_model()
    plan = write_plan(model, work / "plan.json", tools_file=work / "tools.json", formats=name, gamma_max=4)
    template = write_chat_template(model, name, work / "chat-template.jinja")
    spec = ServerSpec(model=model, port=_free_port(), gamma_max=4, plan_path=plan, max_model_len=2048,
                      extra_args=["--enforce-eager"], metrics_dir=work / "prom", chat_template=template,
                      tool_format=tool_format_of(name, name)["name"])
    proc = ServerProcess(spec, log_path=work / "server.log").start()
    try:
        proc.wait_ready(timeout=600)
        yield name, proc
    finally:
        proc.stop()


def _check(calls) -> list[tuple[str, dict]]:
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    out = []
    for call in calls:
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, schemas[call.function.name])
        out.append((call.function.name, args))
    return out


@pytest.mark.server
def test_plain_client_gets_native_tool_calls(served):
    import openai

    name, proc = served
    client = openai.OpenAI(base_url=proc.base_url + "/v1", api_key="EMPTY", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    kw = dict(model=model, messages=ASK, tools=TOOLS, max_tokens=64, temperature=0)
    required = client.chat.completions.create(**kw, tool_choice="required")
    calls = _check(required.choices[0].message.tool_calls or [])
    print(f"{name} required: {calls}")
    assert calls and {n for n, _ in calls} <= {"get_weather", "get_time"}
    spec = required.model_extra["metrics"]["speculative_decoding"]
    assert spec["num_draft_tokens"] > 0
    one = client.chat.completions.create(**kw, tool_choice="required", parallel_tool_calls=False)
    assert len(_check(one.choices[0].message.tool_calls or [])) == 1
    none = client.chat.completions.create(**kw, tool_choice="none")
    assert not none.choices[0].message.tool_calls and none.choices[0].message.content
    # an earlier call and its result in the history: the chat template writes them in the format
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "JST"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "09:00"}]
    after = client.chat.completions.create(**{**kw, "messages": history}, tool_choice="auto")
    message = after.choices[0].message
    print(f"{name} after a result: content={message.content!r} calls={message.tool_calls}")
    _check(message.tool_calls or [])
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")
