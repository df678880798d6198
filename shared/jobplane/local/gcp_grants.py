"""What infra/gcp grants a member of `var.submitters[<owner>]` on the registry, as the GCS fake enforces it.

The module grants three bindings per member (main.tf's submitters_write, submitters_read, submitters_list):
objectCreator under queue/<owner>/, code/<owner>/ and cancels/<owner>/; objectViewer on every team's records
and only its own team's data (teams/<owner>/) and code bundles (code/<owner>/); and a custom role holding
storage.objects.list alone, without a condition, since GCS checks a listing on the bucket's name, never an
object's. The conditions here are rendered exactly as main.tf's (tests/gcp/test_terraform.py compares them), and
read back with jobplane.local.fake_sts's parser, so the local cloud enforces what `terraform apply` deploys.
"""

from __future__ import annotations

import functools
import re

from jobplane.local import fake_sts
from jobplane.model import keys

MEMBER_TOKEN = "member-"  # the fake's token member-<owner>: a member of submitters[<owner>]
CREATES = (keys.QUEUE, keys.CODE, keys.CANCELS)  # each under the owner's own folder
# every team's: records, events, attempts and stop requests (jobs/), drops, rejections, sweeps, admission,
# markers, heartbeats and preempted markers; then the owner's own data and code bundles (READS_OWN)
READS = (keys.JOBS, keys.QUEUE, keys.REJECTED, keys.SWEEPS, keys.ADMISSION, keys.ACTIVE, keys.ACTIVE_SWEEPS,
         keys.HEARTBEATS, keys.PREEMPTED)
READS_OWN = (keys.TEAMS, keys.CODE)
READ_OBJECTS = (keys.POLICY,)
WRITE_ROLE = "roles/storage.objectCreator"
READ_ROLE = "roles/storage.objectViewer"
LIST_PERMISSIONS = ("storage.objects.list",)  # the custom role submitters_list
_FAKE_PERMISSIONS = {"storage.objects.get": "get", "storage.objects.list": "list",
                     "storage.objects.create": "create", "storage.objects.delete": "delete"}


def objects(bucket: str, root: str = "") -> str:
    """main.tf's local.objects: the resource name every object of the registry starts with."""
    root = root.strip("/")
    return f"projects/_/buckets/{bucket}/objects/{root + '/' if root else ''}"


def _check(owner: str) -> None:
    # what variables.tf's validation allows: nothing that could end a CEL string or a folder
    if not re.fullmatch(keys.LABEL_KEY, owner):
        raise ValueError(f"{owner!r} is not an owner name")


def member_token(owner: str) -> str:
    """The GCS fake's token for a member of submitters[owner]."""
    _check(owner)
    return MEMBER_TOKEN + owner


def write_condition(bucket: str, root: str, owner: str) -> str:
    """submitters_write's condition for this owner's members."""
    _check(owner)
    base = objects(bucket, root)
    return " || ".join(f"resource.name.startsWith('{base}{area}{owner}/')" for area in CREATES)


def read_condition(bucket: str, root: str, owner: str) -> str:
    """submitters_read's condition for this owner's members."""
    _check(owner)
    base = objects(bucket, root)
    terms = [f"resource.name.startsWith('{base}{area}')" for area in READS]
    terms += [f"resource.name.startsWith('{base}{area}{owner}/')" for area in READS_OWN]
    terms += [f"resource.name == '{base}{key}'" for key in READ_OBJECTS]
    return " || ".join(terms)


def member_rules(bucket: str, root: str, owner: str) -> tuple[fake_sts.Rule, ...]:
    """The rules the GCS fake enforces on a request of this owner's member: its three bindings."""
    viewer, creator = fake_sts.ROLE_PERMISSIONS[READ_ROLE], fake_sts.ROLE_PERMISSIONS[WRITE_ROLE]
    lister = frozenset(_FAKE_PERMISSIONS[p] for p in LIST_PERMISSIONS)
    return (fake_sts.Rule(bucket, creator, fake_sts.parse_condition(write_condition(bucket, root, owner))),
            fake_sts.Rule(bucket, viewer, fake_sts.parse_condition(read_condition(bucket, root, owner))),
            fake_sts.Rule(bucket, lister, None))


@functools.lru_cache(maxsize=256)  # a few owners' tokens, one per request
def token_rules(token: str, registry: str) -> tuple[fake_sts.Rule, ...] | None:
    """A member token's rules on the registry `bucket[/root]`; none (everything refused) for a member token that
    names no owner; None for any other token."""
    if not token.startswith(MEMBER_TOKEN):
        return None
    bucket, _, root = registry.partition("/")
    try:
        return member_rules(bucket, root, token.removeprefix(MEMBER_TOKEN))
    except ValueError:
        return ()
