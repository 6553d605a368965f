"""Old import path of the BFCL schema normalisation; it lives in `agentspec_sdk.bfcl`."""

from agentspec_sdk.bfcl import BFCL_TYPES, NON_STANDARD_KEYS, UNTYPED, normalise_bfcl_schema

__all__ = ["BFCL_TYPES", "NON_STANDARD_KEYS", "UNTYPED", "normalise_bfcl_schema"]
