"""Checked values of schema keywords that the grammar rules read."""

from __future__ import annotations

from agentspec_sdk.errors import InvalidSchema
from agentspec_sdk.structure.schema.algebra import ptr

__all__ = ["non_negative_int"]


def non_negative_int(schema: dict, key: str, pointer: str, default):
    """`schema[key]` as a non-negative integer (an integral float counts), `default` when absent."""
    value = schema.get(key, default)
    if value is default:
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidSchema(f"{key} must be a non-negative integer", ptr(pointer, key))
    return value
