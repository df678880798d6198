"""The clouds' faults, on demand: which call fails, how, and when a new instance shows in listings (pure).

One model serves the local clouds' servers (`jobplane local up --faults RATE`) and the in-memory fakes of the day
tests (clouds/memory_faults.py). A draw is a function of the seed, the service, the call and how many times that
call was made on that key, so a seed replays the same faults whatever order threads run in.

What a real cloud does, and what is drawn here, each at `rate` of the calls:
- ERROR: the service's throttling or server error (RequestLimitExceeded, SlowDown, rateLimitExceeded, 503...),
  the call not made; the SDKs retry these with backoff, as they would on the cloud.
- LOST (calls that change something): the call takes effect and its response is lost (a 500 or a reset after the
  work was done); the SDK sends it again, so a create must be idempotent (a token, a create-only write).
- CAPACITY (a launch of more than one node): InsufficientInstanceCapacity for the nodes the cloud could not place;
  all-or-nothing APIs (RunInstances with MinCount = MaxCount, bulkInsert) fail the whole request.
- visibility: each new instance is missing from listings for up to VISIBILITY_S (EC2's eventual consistency).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from enum import StrEnum

VISIBILITY_S = 30.0  # the longest a new instance stays out of listings


class Kind(StrEnum):
    ERROR = "error"
    LOST = "lost"
    CAPACITY = "capacity"


@dataclass(frozen=True)
class ApiError:
    """An error as the service answers it: HTTP status and code (the error's name in its own protocol)."""

    status: int
    code: str
    message: str


# Each service's throttling first, then its server errors: what its SDK retries.
SERVICE_ERRORS: dict[str, tuple[ApiError, ...]] = {
    "ec2": (ApiError(503, "RequestLimitExceeded", "Request limit exceeded."),
            ApiError(500, "InternalError", "An internal error has occurred"),
            ApiError(503, "Unavailable", "The server is overloaded and can't handle the request")),
    "s3": (ApiError(503, "SlowDown", "Please reduce your request rate."),
           ApiError(500, "InternalError", "We encountered an internal error. Please try again."),
           ApiError(503, "ServiceUnavailable", "Service is unable to handle request.")),
    "sts": (ApiError(400, "Throttling", "Rate exceeded"),
            ApiError(500, "InternalFailure", "The request processing has failed because of an unknown error")),
    "ssm": (ApiError(400, "ThrottlingException", "Rate exceeded"),
            ApiError(500, "InternalServerError", "An error occurred on the server side")),
    "sns": (ApiError(400, "Throttling", "Rate exceeded"),
            ApiError(500, "InternalError", "Internal error")),
    "vend": (ApiError(429, "TooManyRequestsException", "Rate exceeded"),
             ApiError(503, "ServiceUnavailable", "Service Unavailable")),
    "gce": (ApiError(403, "rateLimitExceeded", "Rate Limit Exceeded"),
            ApiError(503, "backendError", "Backend Error")),
    "gcs": (ApiError(429, "rateLimitExceeded", "The project exceeded the rate limit"),
            ApiError(503, "backendError", "Backend Error")),
    "pubsub": (ApiError(429, "RESOURCE_EXHAUSTED", "Quota exceeded"),
               ApiError(503, "UNAVAILABLE", "The service is currently unavailable")),
}
CAPACITY = ApiError(500, "InsufficientInstanceCapacity",
                    "We currently do not have sufficient capacity in the Availability Zone you requested.")


class ApiFailed(Exception):
    """A call that failed with the service's error after its SDK's retries (the in-memory fakes raise it)."""

    def __init__(self, service: str, error: ApiError) -> None:
        super().__init__(f"{service}: {error.status} {error.code}: {error.message}")
        self.service, self.error = service, error


@dataclass(frozen=True)
class Fault:
    kind: Kind
    error: ApiError


@dataclass
class Faults:
    """Draws faults at `rate` (0 to 1) of the calls, from `seed`; counts what it drew by service and kind."""

    rate: float
    seed: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # "<service> <kind>" -> faults drawn
    calls: dict[str, int] = field(default_factory=dict)  # service -> calls seen
    _seen: dict[tuple[str, str, str], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not 0 <= self.rate <= 1:
            raise ValueError(f"a fault rate is between 0 and 1, got {self.rate}")

    def _rng(self, service: str, call: str, key: str) -> random.Random:
        with self._lock:
            n = self._seen[service, call, key] = self._seen.get((service, call, key), 0) + 1
            self.calls[service] = self.calls.get(service, 0) + 1
        return random.Random(f"{self.seed}/{service}/{call}/{key}/{n}")

    def _count(self, service: str, kind: Kind) -> None:
        with self._lock:
            name = f"{service} {kind}"
            self.counts[name] = self.counts.get(name, 0) + 1

    def draw(self, service: str, call: str, key: str = "", *, mutates: bool = False, nodes: int = 1) -> Fault | None:
        """The fault this call meets, or None. `mutates`: the call changes something (its response may be lost
        after it took effect); `nodes`: how many instances it launches (more than one may meet capacity)."""
        if self.rate <= 0:
            return None
        rng = self._rng(service, call, key)
        hit, which, kind = rng.random(), rng.random(), rng.random()
        if nodes > 1 and rng.random() < self.rate:
            self._count(service, Kind.CAPACITY)
            return Fault(Kind.CAPACITY, CAPACITY)
        if hit >= self.rate:
            return None
        errors = SERVICE_ERRORS[service]
        if mutates and kind < 1 / 3:  # a third of a write's faults land and lose their response
            self._count(service, Kind.LOST)
            return Fault(Kind.LOST, errors[1 % len(errors)])
        self._count(service, Kind.ERROR)
        return Fault(Kind.ERROR, errors[int(which * len(errors))])

    def visible_after(self, instance_id: str) -> float:
        """Seconds after its launch an instance first shows in listings (0 with no faults)."""
        if self.rate <= 0:
            return 0.0
        return random.Random(f"{self.seed}/visible/{instance_id}").random() * VISIBILITY_S

    def total(self) -> int:
        return sum(self.counts.values())


def parse(text: str) -> tuple[float, int]:
    """`RATE[:SEED]` (an environment variable's form) as (rate, seed)."""
    rate, _, seed = text.partition(":")
    return float(rate), int(seed or 0)
