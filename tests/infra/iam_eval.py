"""Evaluate a synthesized role's Allow statements for one request, the way IAM does for identity policies:
an action and resource match (with * wildcards) and every condition holds. Enough to prove what the
template lets a function do; CloudFormation intrinsics are resolved with fixed pseudo-parameters."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

PSEUDO = {"AWS::Partition": "aws", "AWS::Region": "us-east-1", "AWS::AccountId": "123456789012",
          "AWS::URLSuffix": "amazonaws.com"}


def resolve(value: Any) -> Any:
    """Flatten intrinsics: pseudo-parameters to fixed values, other Refs/GetAtts to '<Id>' / '<Id.Attr>'."""
    if isinstance(value, dict) and len(value) == 1:
        (fn, arg), = value.items()
        if fn == "Ref":
            return PSEUDO.get(arg, f"<{arg}>")
        if fn == "Fn::GetAtt":
            return f"<{arg[0]}.{arg[1]}>"
        if fn == "Fn::Join":
            return arg[0].join(str(resolve(part)) for part in arg[1])
    if isinstance(value, list):
        return [resolve(v) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v) for k, v in value.items()}
    return value


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@dataclass(frozen=True)
class Request:
    action: str
    resource: str
    context: dict[str, str] = field(default_factory=dict)  # aws:RequestTag/..., aws:ResourceTag/..., ...


def _condition_holds(conditions: dict[str, dict[str, Any]], context: dict[str, str]) -> bool:
    for operator, pairs in conditions.items():
        for key, expected in pairs.items():
            actual = context.get(key)
            if operator == "StringEquals":
                ok = actual is not None and actual in _as_list(expected)
            elif operator == "StringLike":
                ok = actual is not None and any(fnmatchcase(actual, p) for p in _as_list(expected))
            else:
                raise AssertionError(f"unsupported condition operator {operator}")
            if not ok:
                return False
    return True


_VARIABLE = re.compile(r"\$\{([^}]+)\}")


def _substitute(pattern: str, context: dict[str, str]) -> str | None:
    """A resource with its policy variables (${aws:PrincipalTag/team}) replaced from the request context;
    None when one is missing from it: IAM then treats the statement as not matching."""
    missing: list[str] = []

    def value(m: re.Match[str]) -> str:
        if m.group(1) not in context:
            missing.append(m.group(1))
        return context.get(m.group(1), "")

    out = _VARIABLE.sub(value, pattern)
    return None if missing else out


def allows(statements: list[dict[str, Any]], request: Request) -> bool:
    for st in statements:
        if st.get("Effect") != "Allow":
            continue
        if not any(fnmatchcase(request.action, a) for a in _as_list(st["Action"])):
            continue
        patterns = [_substitute(r, request.context) for r in _as_list(resolve(st["Resource"]))]
        if not any(p is not None and fnmatchcase(request.resource, p) for p in patterns):
            continue
        if _condition_holds(resolve(st.get("Condition", {})), request.context):
            return True
    return False


def managed_policy_statements(template: dict[str, Any], contains: str) -> list[dict[str, Any]]:
    """The statements of the one AWS::IAM::ManagedPolicy whose logical id contains `contains`."""
    (found,) = [res for key, res in template["Resources"].items()
                if res["Type"] == "AWS::IAM::ManagedPolicy" and contains in key]
    return list(found["Properties"]["PolicyDocument"]["Statement"])


def role_statements(template: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    """Every statement of every AWS::IAM::Policy attached to the role (the role has no inline policies)."""
    out: list[dict[str, Any]] = []
    for res in template["Resources"].values():
        if res["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in res["Properties"].get("Roles", []):
            out += res["Properties"]["PolicyDocument"]["Statement"]
    role = template["Resources"][role_id]["Properties"]
    assert not role.get("Policies") and not role.get("ManagedPolicyArns"), "role has policies outside AWS::IAM::Policy"
    return out
