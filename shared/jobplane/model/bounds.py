"""The bounds a job spec and the policy share: durations (their type, parsing and ceilings) and attempts.

Apart from spec.py so that the policy, which every handler run reads, is validated without building the
spec's models (a scheduled run that finds nothing to launch or check never needs them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

from pydantic import BeforeValidator, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationInfo, WithJsonSchema
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

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


def _stored(info: ValidationInfo) -> bool:
    return isinstance(info.context, Mapping) and bool(info.context.get("stored"))


Duration = Annotated[
    int,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1},
                {"type": "string", "pattern": r"^\s*\d+\s*[smhd]?\s*$"},
            ],
            "description": "seconds, or a number with unit s, m, h or d",
        }
    ),
]


@dataclass(frozen=True)
class AtMost:
    """A duration's ceiling, as `Annotated[Duration, AtMost(MAX_WAIT)]`: a new spec (or policy) over it is refused
    naming the field; a spec read back from a record (context STORED) is read as it was accepted, so a job recorded
    before a ceiling stays readable, and the decisions bound what they take from it."""

    seconds: int

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.with_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        out = dict(handler(schema))
        seconds, text = out["anyOf"]
        out["anyOf"] = [{**seconds, "maximum": self.seconds}, text]
        out["description"] = f"{out['description']}; at most {format_duration(self.seconds)}"
        return out

    def _check(self, value: int, info: ValidationInfo) -> int:
        if value > self.seconds and not _stored(info):
            raise ValueError(f"{format_duration(value)} is more than the ceiling of {format_duration(self.seconds)}")
        return value


MAX_RESTARTS = 100
MAX_RETRIES = 100
MAX_ATTEMPTS = 1 + MAX_RESTARTS + MAX_RETRIES  # what a spec may ask for; the policy's max_attempts_per_job is lower
