import importlib.resources
import json

import pydantic
import pytest

from agentspec_sdk import bfcl
from agentspec_sdk.bfcl import normalise_bfcl_schema
from agentspec_sdk.errors import InvalidSchema, ToolRegistryError
from agentspec_sdk.structure.tools import Tool, ToolRegistry, parse_docstring


def search(query: str, k: int = 3, tags: list[str] | None = None) -> str:
    """Search the web.

    Args:
        query (str): what to look
            for, exactly.
        k: how many results.
    """
    return query


def add(x: float, y: int):
    """Add two numbers.

    Parameters
    ----------
    x : float
        The first
        number.
    y : int
        The second.

    Returns
    -------
    float
    """
    return x + y


class Booking(pydantic.BaseModel):
    """Book a table."""

    restaurant: str
    guests: int = pydantic.Field(ge=1, description="party size")
    title: str | None = None  # a property named "title" must survive title stripping


def test_callable_with_google_docstring():
    tool = ToolRegistry([search]).get("search")
    assert tool.description == "Search the web."
    assert tool.fn is search
    assert tool.parameters["required"] == ["query"]
    props = tool.parameters["properties"]
    assert list(props) == ["query", "k", "tags"]
    assert props["query"] == {"description": "what to look for, exactly.", "type": "string"}
    assert props["k"]["type"] == "integer" and props["k"]["default"] == 3
    assert "title" not in json.dumps(tool.parameters)


def test_callable_with_numpy_docstring():
    tool = ToolRegistry([add]).get("add")
    assert tool.description == "Add two numbers."
    assert tool.parameters["properties"]["x"] == {"description": "The first number.", "type": "number"}
    assert tool.parameters["properties"]["y"]["description"] == "The second."


def test_parse_docstring_without_sections():
    assert parse_docstring("Just a summary.\n\nMore.") == ("Just a summary.\n\nMore.", {})


def test_pydantic_model():
    tool = ToolRegistry([Booking]).get("Booking")
    assert tool.description == "Book a table."
    props = tool.parameters["properties"]
    assert list(props) == ["restaurant", "guests", "title"]
    assert props["guests"] == {"description": "party size", "minimum": 1, "type": "integer"}
    assert "title" in props


OPENAI_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_openai_dict_and_export():
    reg = ToolRegistry([OPENAI_TOOL])
    assert reg.get("get_weather").parameters == OPENAI_TOOL["function"]["parameters"]
    assert reg.openai_tools() == [OPENAI_TOOL]


def test_langchain_tool():
    tools = pytest.importorskip("langchain_core.tools", reason="extra: langgraph (no langchain-core)")

    @tools.tool
    def lookup(city: str, days: int = 1) -> str:
        """Look up a forecast.

        Args:
            city: the city name
            days: how many days
        """
        return city

    tool = ToolRegistry([lookup]).get("lookup")
    assert tool.description.startswith("Look up a forecast.")
    assert list(tool.parameters["properties"]) == ["city", "days"]
    assert tool.parameters["required"] == ["city"]
    assert tool.parameters["properties"]["days"]["type"] == "integer"
    assert "title" not in tool.parameters


def _bfcl_functions(name: str, limit: int):
    data = importlib.resources.files("bfcl_eval") / "data" / name
    out = []
    for line in data.read_text(encoding="utf-8").splitlines()[:limit]:
        out.extend(json.loads(line)["function"])
    return out


def test_bfcl_docs_are_normalised():
    pytest.importorskip("bfcl_eval", reason="bfcl-eval missing: scripts/setup.sh installs it")
    docs = _bfcl_functions("BFCL_v4_simple_python.json", 50) + _bfcl_functions("BFCL_v4_simple_java.json", 20)
    reg = ToolRegistry()
    for doc in docs:
        if doc["name"] not in reg:
            reg.add(bfcl.function_tool(doc))  # BFCL's normalisation runs where BFCL docs are read
    text = json.dumps([t.parameters for t in reg.tools])
    for bfcl_type in ('"dict"', '"float"', '"tuple"', '"any"', '"String"', '"HashMap"'):
        assert f'"type": {bfcl_type}' not in text
    first = reg.get(docs[0]["name"])
    assert first.parameters["type"] == "object"


def test_normalise_bfcl_schema_types():
    schema = {
        "type": "dict",
        "properties": {
            "x": {"type": "float"},
            "pair": {"type": "tuple", "items": {"type": "integer"}},
            "anything": {"type": "any", "description": "d"},
            "nested": {"type": "dict", "properties": {"s": {"type": "String"}}},
            "type": {"type": "string"},  # a property called "type" is not a keyword
        },
    }
    out = normalise_bfcl_schema(schema)
    assert out["type"] == "object"
    assert out["properties"]["x"] == {"type": "number"}
    assert out["properties"]["pair"] == {"type": "array", "items": {"type": "integer"}}
    assert out["properties"]["anything"] == {"description": "d"}
    assert out["properties"]["nested"]["properties"]["s"] == {"type": "string"}
    assert out["properties"]["type"] == {"type": "string"}
    with pytest.raises(InvalidSchema, match=r"unknown BFCL type 'complex' \(at /properties/z/type\)"):
        normalise_bfcl_schema({"type": "dict", "properties": {"z": {"type": "complex"}}})
    with pytest.raises(ToolRegistryError, match="tool 'f'.*unknown BFCL type 'complex'"):
        bad = {"type": "dict", "properties": {"z": {"type": "complex"}}}
        ToolRegistry().add(bfcl.function_tool({"name": "f", "parameters": bad}))


def test_registry_knows_json_schema_only():
    # the registry keeps a standard schema as given (every keyword, key order), with one tidy rule:
    # an object schema listing neither properties nor additionalProperties gets properties {}
    params = {"type": "object", "properties": {"meta": {"type": "object", "description": "d"},
                                               "xs": {"type": ["array"], "items": {"type": "integer"}},
                                               "n": {"type": ["integer", "null"], "x-note": 1}},
              "required": ["xs"]}
    tool = ToolRegistry([{"name": "f", "parameters": params}]).get("f")
    assert tool.parameters == {"type": "object", "properties": {
        "meta": {"type": "object", "description": "d", "properties": {}},
        "xs": {"type": "array", "items": {"type": "integer"}},
        "n": {"type": ["integer", "null"], "x-note": 1}}, "required": ["xs"]}
    assert params["properties"]["meta"] == {"type": "object", "description": "d"}  # the caller's dict stays
    # BFCL's type names are BFCL's: a raw BFCL doc is read through agentspec_sdk.bfcl
    with pytest.raises(ToolRegistryError, match=r"tool 'g': unknown JSON Schema type 'dict' \(one of \['a"):
        ToolRegistry().add({"name": "g", "parameters": {"type": "dict", "properties": {}}})
    with pytest.raises(ToolRegistryError, match=r"type 'float'.*\(at /properties/x/type\)"):
        ToolRegistry().add({"name": "g", "parameters": {"type": "object",
                                                        "properties": {"x": {"type": "float"}}}})
    assert ToolRegistry().add(bfcl.function_tool({"name": "g", "parameters": {
        "type": "dict", "properties": {"x": {"type": "float"}}}})).parameters == {
        "type": "object", "properties": {"x": {"type": "number"}}}


def test_duplicate_and_invalid_names():
    reg = ToolRegistry([search])
    with pytest.raises(ToolRegistryError, match="duplicate tool name 'search'"):
        reg.add(search)
    with pytest.raises(ToolRegistryError, match="invalid tool name 'bad name'"):
        reg.add({"name": "bad name", "parameters": {"type": "object"}})
    with pytest.raises(ToolRegistryError, match="invalid tool name"):
        reg.add({"name": "x" * 65})
    with pytest.raises(ToolRegistryError, match="tool 'neg': parameters must have type 'object'"):
        reg.add({"name": "neg", "parameters": {"type": "string"}})
    with pytest.raises(ToolRegistryError, match="unknown tool 'nope'"):
        reg.get("nope")
    with pytest.raises(ToolRegistryError, match="cannot make a tool from int"):
        reg.add(3)


def test_unresolvable_type_hint_is_a_clear_error():
    def weird(x: "NotAType") -> None:  # noqa: F821
        """Weird."""

    with pytest.raises(ToolRegistryError, match="tool 'weird'"):
        ToolRegistry([weird])


def test_tools_json_round_trip(tmp_path):
    reg = ToolRegistry([search, add, Booking, OPENAI_TOOL])
    path = reg.save(tmp_path / "tools.json")
    back = ToolRegistry.load(path)
    assert back == reg
    assert [t.name for t in back] == ["search", "add", "Booking", "get_weather"]
    assert ToolRegistry.from_json({"tools": json.loads(reg.to_json())}) == reg
    with pytest.raises(ToolRegistryError, match="not valid JSON"):
        ToolRegistry.from_json("{nope")
    with pytest.raises(ToolRegistryError, match="cannot read tools file"):
        ToolRegistry.load(tmp_path / "missing.json")


def test_ten_thousand_tools_register():
    docs = [
        {"name": f"tool_{i}", "description": "d",
         "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}
        for i in range(10_000)
    ]
    reg = ToolRegistry(docs)
    assert len(reg) == 10_000
    assert reg.get("tool_9999").parameters["properties"]["a"] == {"type": "integer"}


def test_rename_on_add():
    tool = ToolRegistry().add(search, name="web.search", description="Find pages.")
    assert tool == Tool("web.search", "Find pages.", tool.parameters)
