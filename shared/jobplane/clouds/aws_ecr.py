"""Pulling a job's container image from ECR with the VM's own identity (its instance role)."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config

RETRIES = Config(retries={"mode": "adaptive", "max_attempts": 8})

# ACCOUNT.dkr.ecr.REGION.amazonaws.com (and .com.cn, and the FIPS endpoints)
ECR_HOST = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")


def ecr_login(client_for: Callable[[str], Any] | None = None) -> Callable[[str], tuple[str, str] | None]:
    """host -> (user, password) for an ECR registry, from GetAuthorizationToken in the registry's region;
    None for any other registry (pulled anonymously)."""
    def client(region: str) -> Any:
        return client_for(region) if client_for else boto3.client("ecr", region_name=region, config=RETRIES)

    def login(host: str) -> tuple[str, str] | None:
        m = ECR_HOST.match(host)
        if m is None:
            return None
        answer = client(m.group("region")).get_authorization_token(registryIds=[m.group("account")])
        user, password = base64.b64decode(answer["authorizationData"][0]["authorizationToken"]).decode().split(":", 1)
        return user, password

    return login
