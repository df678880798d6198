"""Small helpers shared by test packages."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def wait_for(what: str, check: Callable[[], Any], timeout: float = 15.0, every: float = 0.1) -> Any:
    """Poll check() until it returns something truthy; fail naming what never happened."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


@dataclass
class LambdaContext:
    """The attributes of a Lambda context that Powertools reads."""

    function_name: str = "jobplane-test"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:jobplane-test"
    aws_request_id: str = "req-1"
