"""Structure core: agent formats, segmenter, tool registry, JSON Schema → Lark. Pure Python."""
