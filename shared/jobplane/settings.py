"""Where the registry is: read once from the environment by handlers, the CLI and the agent."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    bucket: str
    root: str = ""
    region: str | None = None
    cloud: str = "aws"

    @classmethod
    def from_env(cls, bucket: str | None = None) -> Settings:
        name = bucket or os.environ.get("JOBPLANE_BUCKET", "")
        if not name:
            raise RuntimeError("no registry bucket: set JOBPLANE_BUCKET or pass --bucket")
        return cls(
            bucket=name,
            root=os.environ.get("JOBPLANE_ROOT", ""),
            region=os.environ.get("JOBPLANE_REGION") or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION"),
            cloud=os.environ.get("JOBPLANE_CLOUD", "aws"),
        )
