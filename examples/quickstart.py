"""The README's quick start: one tool, one turn on the embedded engine with the structure proposer."""

from agentspec_sdk import Engine, ToolRegistry, TurnRequest


def get_weather(city: str, unit: str = "celsius") -> str:
    """Current weather for a city."""
    return f"21 degrees {unit} in {city}"


if __name__ == "__main__":  # vLLM spawns engine processes
    tools = ToolRegistry()
    tools.add(get_weather)  # callables, pydantic models, OpenAI dicts, LangChain tools, BFCL docs
    engine = Engine(speculation="structure", tools=tools)  # embedded vllm.LLM, default model
    [result] = engine.generate([TurnRequest(
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        fmt="tool_calls", tools=tools, tool_choice="call", max_tokens=64)])
    print(result.text)  # <tool_call>{"name":"get_weather","arguments":{...}}</tool_call>
    print(result.acceptance)  # drafted / accepted per law class (S, R, F)
    engine.close()
