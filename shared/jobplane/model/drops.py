"""queue/ drops: which keys are drops, whose they are, and the spec each holds, read the one way the launcher
and the CLI both read it.

A drop is queue/<owner>/<job-id>.yaml (or .yml, .json), or queue/<job-id>.yaml for a single-team deployment
(owner `default`); jobplane.model.keys builds and parses those keys (queue_entry, parse_drop). The owner is where
the drop could be written, not what the spec says: the stack offers IAM that lets a principal write only under
its own queue/<owner>/, so a spec whose `owner` differs from its drop's is refused, naming the field. Quotas
count by that owner.
"""

from __future__ import annotations

import re

from jobplane.model.errors import FieldError, SpecError
from jobplane.model.keys import LABEL_KEY, Drop
from jobplane.model.spec import JobSpec, parse_spec

EXTENSIONS = ("yaml", "yml", "json")


def problems(drop: Drop) -> list[FieldError]:
    """What is wrong with a drop's key itself: its extension, or a folder that is not an owner name."""
    errors: list[FieldError] = []
    if drop.ext not in EXTENSIONS:
        errors.append(FieldError("(file)", "queue entries must be named <job-id>.yaml, .yml or .json, under "
                                           "queue/ or queue/<owner>/"))
    if drop.folder is not None and not re.match(LABEL_KEY, drop.folder):
        errors.append(FieldError("owner", f"queue/{drop.folder}/ is not an owner's folder: an owner is a lowercase "
                                          f"letter, then up to 62 of a-z 0-9 _ - (drops go in queue/<owner>/)"))
    return errors


def read_spec(drop: Drop, data: bytes | str) -> JobSpec:
    """The drop's spec, its owner the drop's; SpecError (naming the fields) for a bad key, a bad spec, or an
    `owner:` that is not the drop's."""
    errors = problems(drop)
    if errors:
        raise SpecError(errors)
    spec = parse_spec(data, job_id=drop.job_id, source=drop.name)
    if "owner" in spec.model_fields_set and spec.owner != drop.owner:
        where = f"queue/{drop.folder}/" if drop.folder else "queue/ (owner default)"
        raise SpecError([FieldError("owner", f"{spec.owner!r} is not the owner of this drop: it was written to "
                                             f"{where}; drop it under queue/{spec.owner}/ (jobplane submit does), "
                                             f"or leave `owner` out")])
    return spec.model_copy(update={"owner": drop.owner})

