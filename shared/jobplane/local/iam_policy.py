"""IAM's evaluation of identity policies for one request, for the local cloud's moto (jobplane.local.moto_server):
the statements that match the action, the resource and every condition; an explicit Deny wins, else an Allow
allows. moto's own evaluator ignores StringLike conditions and turns any unmet condition into a Deny, so an Allow
conditioned on s3:prefix would allow every listing there, or none; this one agrees with AWS on what jobplane's
policies use.

Operators: String(Not)Equals, String(Not)Like, StringEqualsIgnoreCase, Arn(Not)Equals, Arn(Not)Like, Bool, Null,
each with IfExists. A statement with any other operator is never applied if it allows and always if it denies:
what is not understood never grants. Policy variables in a Resource (`${aws:PrincipalTag/jobplane-owner}`) take the
request context's value, literally (a `*` in a tag's value is no wildcard); a resource naming a variable the
context lacks matches nothing, as in IAM.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

ALLOW, DENY = "Allow", "Deny"


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@lru_cache(maxsize=4096)
def _pattern(glob: str, ignore_case: bool) -> re.Pattern[str]:
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)
    return re.compile(f"^{body}$", re.S | (re.I if ignore_case else 0))


def matches(glob: str, value: str, ignore_case: bool = False) -> bool:
    return _pattern(glob, ignore_case).match(value) is not None


_VARIABLE = re.compile(r"\$\{([^}]+)\}")


def resource_matches(pattern: str, resource: str, context: Mapping[str, str]) -> bool:
    """A Resource element's pattern against the request's resource, its policy variables substituted."""
    if "${" not in pattern:
        return matches(pattern, resource)
    lowered = {k.lower(): v for k, v in context.items()}
    parts: list[str] = []
    for i, piece in enumerate(_VARIABLE.split(pattern)):
        if i % 2 == 0:
            parts.append(_pattern(piece, False).pattern[1:-1])  # a glob piece, as a regular expression
        elif (value := lowered.get(piece.lower())) is None:
            return False
        else:
            parts.append(re.escape(value))
    return re.fullmatch("".join(parts), resource, re.S) is not None


class Unsupported(Exception):
    pass


def _operator_holds(operator: str, expected: list[str], actual: str | None) -> bool:
    name = operator.removesuffix("IfExists")
    if actual is None:
        return operator.endswith("IfExists") or (name == "Null" and "true" in [str(e).lower() for e in expected])
    if name == "Null":
        return "false" in [str(e).lower() for e in expected]
    negated = "Not" in name
    base = name.replace("Not", "")
    if base in ("StringEquals", "ArnEquals"):
        hit = actual in expected
    elif base == "StringEqualsIgnoreCase":
        hit = actual.lower() in [e.lower() for e in expected]
    elif base in ("StringLike", "ArnLike"):
        hit = any(matches(e, actual) for e in expected)
    elif base == "Bool":
        hit = actual.lower() in [str(e).lower() for e in expected]
    else:
        raise Unsupported(operator)
    return not hit if negated else hit


def conditions_hold(conditions: Mapping[str, Mapping[str, Any]], context: Mapping[str, str]) -> bool:
    """Every operator's every key holds (keys are case-insensitive, as in IAM)."""
    lowered = {k.lower(): v for k, v in context.items()}
    return all(_operator_holds(op, [str(e) for e in _as_list(expected)], lowered.get(key.lower()))
               for op, pairs in conditions.items() for key, expected in pairs.items())


def statement_applies(statement: Mapping[str, Any], action: str, resource: str, context: Mapping[str, str]) -> bool:
    if "Action" in statement:
        acts = any(matches(a, action, ignore_case=True) for a in _as_list(statement["Action"]))
    else:
        acts = not any(matches(a, action, ignore_case=True) for a in _as_list(statement.get("NotAction", [])))
    if not acts:
        return False
    if "Resource" in statement:
        on = any(resource_matches(r, resource, context) for r in _as_list(statement["Resource"]))
    else:
        on = not any(resource_matches(r, resource, context) for r in _as_list(statement.get("NotResource", [])))
    if not on:
        return False
    try:
        return conditions_hold(statement.get("Condition", {}), context)
    except Unsupported:
        return statement.get("Effect") == DENY


def evaluate(documents: Iterable[Mapping[str, Any]], action: str, resource: str,
             context: Mapping[str, str] | None = None) -> str | None:
    """DENY if a matching statement denies, else ALLOW if one allows, else None (an implicit deny)."""
    effects = {st.get("Effect") for doc in documents for st in _as_list(doc.get("Statement", []))
               if statement_applies(st, action, resource, context or {})}
    return DENY if DENY in effects else ALLOW if ALLOW in effects else None


def session_allows(role: Iterable[Mapping[str, Any]], session: Mapping[str, Any] | None, action: str, resource: str,
                   context: Mapping[str, str] | None = None) -> bool:
    """An assumed-role session's request: the role's policies allow it and, with a session policy, so does that;
    an explicit Deny in either refuses (the intersection AWS computes)."""
    role = list(role)
    if evaluate(role, action, resource, context) != ALLOW:
        return False
    return session is None or evaluate([session], action, resource, context) == ALLOW
