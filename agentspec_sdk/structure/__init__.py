"""Structure core, pure Python: agent formats, segmenter, tool registry, turn grammars and turn parsing;
the JSON Schema compiler they build on is the subpackage `schema` (it imports nothing of this side)."""
