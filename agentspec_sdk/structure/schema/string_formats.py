"""String `format`s: the ones the compiler asserts (as ECMA regexes over the decoded string;
approximations documented in docs/schema_coverage.md) and the ones it knows but cannot express."""

from __future__ import annotations

__all__ = ["FORMATS", "KNOWN_FORMATS"]

_MONTH_DAY = r"((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))"
_LEAP_YEAR = r"(\d\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
# RFC 3339 full-date, month lengths and leap years exact
_DATE = rf"(\d{{4}}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_TIME = r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
_OCTET = r"(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
FORMATS = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}[Tt]{_TIME}$",
    "email": (r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
              r"(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$"),
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "uri": r"^[A-Za-z][A-Za-z0-9+.-]*:[^\s\"<>\\^`{|}]*$",
    "ipv4": rf"^({_OCTET}\.){{3}}{_OCTET}$",
    "hostname": (r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                 r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"),
}
# Formats the specifications define but this compiler does not express: asserting them is not
# possible, so they raise unless the "format" relaxation is given. Other names are annotations.
KNOWN_FORMATS = {
    "idn-email", "idn-hostname", "ipv6", "uri-reference", "iri", "iri-reference",
    "uri-template", "json-pointer", "relative-json-pointer", "regex", "duration",
}
