"""The STS token exchange with a Credential Access Boundary, as the GCS fake serves and enforces it.

`exchange` reads the form google.oauth2.sts sends (grant_type token-exchange, an access token as subject, the
boundary in `options`) and returns the rules a minted token carries; `allowed` answers, for one request made
with such a token, whether some rule's role holds the permission and its condition holds on the object (or,
for a listing, on the prefix). Conditions are evaluated in the CEL subset the boundaries use: terms joined by
`||`, each `resource.name.startsWith('...')`, `resource.name == '...'` or
`api.getAttribute('storage.googleapis.com/objectListPrefix', '').startsWith('...')`; a boundary with anything
else is refused at the exchange (400), never guessed at.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

# What each role holds of what the fake checks: get (metadata and media), list, create, delete (also needed to
# overwrite an object, as on GCS).
ROLE_PERMISSIONS = {
    "roles/storage.objectViewer": frozenset({"get", "list"}),
    "roles/storage.objectCreator": frozenset({"create"}),
    "roles/storage.objectUser": frozenset({"get", "list", "create", "delete"}),
    "roles/storage.objectAdmin": frozenset({"get", "list", "create", "delete"}),
}
MAX_RULES = 10
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"
_RESOURCE = re.compile(r"//storage\.googleapis\.com/projects/_/buckets/(?P<bucket>[a-z0-9._-]+)")
_TERMS = [
    ("object-prefix", re.compile(r"resource\.name\.startsWith\('(?P<v>[^'\\]*)'\)")),
    ("object", re.compile(r"resource\.name == '(?P<v>[^'\\]*)'")),
    ("list-prefix", re.compile(
        r"api\.getAttribute\('storage\.googleapis\.com/objectListPrefix', ''\)\.startsWith\('(?P<v>[^'\\]*)'\)")),
]


class BadBoundary(ValueError):
    """The exchange request or its boundary is not one STS (as faked) accepts."""


@dataclass(frozen=True)
class Term:
    kind: str  # object-prefix | object | list-prefix
    value: str

    def holds(self, resource_name: str, list_prefix: str | None) -> bool:
        if self.kind == "list-prefix":
            return list_prefix is not None and list_prefix.startswith(self.value)
        if self.kind == "object":
            return resource_name == self.value
        return resource_name.startswith(self.value)


@dataclass(frozen=True)
class Rule:
    bucket: str
    permissions: frozenset[str]
    terms: tuple[Term, ...] | None  # None: no condition, the whole bucket

    def allows(self, permission: str, bucket: str, name: str | None, list_prefix: str | None) -> bool:
        if bucket != self.bucket or permission not in self.permissions:
            return False
        if self.terms is None:
            return True
        # GCS checks a listing on the bucket, an object operation on the object
        resource = f"projects/_/buckets/{bucket}" + (f"/objects/{name}" if name is not None else "")
        return any(t.holds(resource, list_prefix) for t in self.terms)


def parse_condition(expression: str) -> tuple[Term, ...]:
    terms = []
    for text in expression.split("||"):
        for kind, pattern in _TERMS:
            match = pattern.fullmatch(text.strip())
            if match:
                terms.append(Term(kind, match["v"]))
                break
        else:
            raise BadBoundary(f"the fake STS does not evaluate the condition term {text.strip()!r}")
    return tuple(terms)


def parse_rule(rule: Mapping[str, object]) -> Rule:
    resource = _RESOURCE.fullmatch(str(rule.get("availableResource", "")))
    if resource is None:
        raise BadBoundary(f"availableResource {rule.get('availableResource')!r} is not a bucket")
    permissions: set[str] = set()
    for named in rule.get("availablePermissions") or []:  # type: ignore[attr-defined]
        role = str(named).removeprefix("inRole:")
        if not str(named).startswith("inRole:") or role not in ROLE_PERMISSIONS:
            raise BadBoundary(f"availablePermissions {named!r}: the fake knows inRole: of {sorted(ROLE_PERMISSIONS)}")
        permissions |= ROLE_PERMISSIONS[role]
    condition = rule.get("availabilityCondition")
    expression = condition.get("expression") if isinstance(condition, Mapping) else None
    return Rule(resource["bucket"], frozenset(permissions), parse_condition(str(expression)) if expression else None)


def exchange(form: Mapping[str, str]) -> tuple[Rule, ...]:
    """The rules of the token STS mints for this token-exchange form."""
    if form.get("grant_type") != GRANT_TYPE:
        raise BadBoundary(f"grant_type must be {GRANT_TYPE}")
    if form.get("subject_token_type") != ACCESS_TOKEN or not form.get("subject_token"):
        raise BadBoundary("subject_token (an access token) is required")
    try:
        options = json.loads(unquote(form.get("options", "")))
        rules = options["accessBoundary"]["accessBoundaryRules"]
    except (ValueError, KeyError, TypeError):
        raise BadBoundary("options must hold accessBoundary.accessBoundaryRules") from None
    if not isinstance(rules, list) or not 1 <= len(rules) <= MAX_RULES:
        raise BadBoundary(f"a Credential Access Boundary holds 1 to {MAX_RULES} rules")
    return tuple(parse_rule(r) for r in rules)


def allowed(rules: tuple[Rule, ...], permission: str, bucket: str, name: str | None = None,
            list_prefix: str | None = None) -> bool:
    return any(r.allows(permission, bucket, name, list_prefix) for r in rules)


def within(rules: tuple[Rule, ...], source: tuple[Rule, ...]) -> tuple[Rule, ...]:
    """The boundary's rules cut to what the source token's unconditioned bindings hold: STS never widens a token
    (a boundary rule on a bucket the source cannot reach grants nothing)."""
    cut = []
    for rule in rules:
        held = frozenset().union(*(s.permissions for s in source if s.bucket == rule.bucket and s.terms is None))
        if rule.permissions & held:
            cut.append(Rule(rule.bucket, rule.permissions & held, rule.terms))
    return tuple(cut)


def read_only(reads: tuple[str, ...]) -> tuple[Rule, ...]:
    """Rules for `bucket/prefix` entries: objectViewer on those prefixes only (the VM's own token on the agent
    bundles); a bucket named by none is not covered."""
    by_bucket: dict[str, list[Term]] = {}
    for entry in reads:
        bucket, _, prefix = entry.partition("/")
        by_bucket.setdefault(bucket, []).extend([
            Term("object-prefix", f"projects/_/buckets/{bucket}/objects/{prefix}"), Term("list-prefix", prefix)])
    viewer = ROLE_PERMISSIONS["roles/storage.objectViewer"]
    return tuple(Rule(bucket, viewer, tuple(terms)) for bucket, terms in by_bucket.items())
