"""The bounds a job spec and the policy share: durations (parsing and ceilings) and attempts.

Apart from spec.py and free of pydantic so that the policy, which every handler run reads, is validated without
pydantic (jobplane.model.checked); the spec's duration type is jobplane.model.specfields.Duration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_RE = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
DURATION_HELP = "use whole seconds or a number with unit s, m, h or d (e.g. 90s, 30m, 8h, 2d)"


def parse_duration(value: object) -> int:
    """'90s' | '30m' | '8h' | '2d' | 3600 -> seconds."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}: {DURATION_HELP}")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and value.strip().isdigit():
        seconds = int(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = int(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise ValueError(f"invalid duration {value!r}: {DURATION_HELP}")
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    return seconds


def format_duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


# Every duration has a ceiling: a value past it is refused naming its field, and no time a decision computes from
# one (created_at + max_wait, a refusal + spot.after) can leave the calendar (a datetime past the year 9999 raises).
DAY = 86400
MAX_RUNTIME = 30 * DAY  # an attempt's uptime cap; the policy's max_runtime_ceiling is lower (7d by default)
MAX_WAIT = 90 * DAY  # a job's whole wait (capacity, reruns); the policy's max_wait_ceiling is lower (14d by default)
MAX_SPOT_WAIT = 7 * DAY  # spot.after: Spot refused everywhere this long, then on-demand
MAX_STALL_TIMEOUT = 7 * DAY  # silence (no heartbeat, no output) before a job is called stalled
MAX_BOOT_TIMEOUT = DAY  # the VM fetches its agent by URLs that live this long and 10 minutes (7 days at most)
MAX_STOP_GRACE = 3600  # a Spot notice gives 2 minutes (EC2) or 30 s (GCE) anyway
MAX_DEBUG_HOLD = DAY  # a FAILED attempt's VMs kept for a look: they bill all along
STORED: Final[Mapping[str, bool]] = {"stored": True}  # the validation context of a spec read back from a record


MAX_RESTARTS = 100
MAX_RETRIES = 100
MAX_ATTEMPTS = 1 + MAX_RESTARTS + MAX_RETRIES  # what a spec may ask for; the policy's max_attempts_per_job is lower
