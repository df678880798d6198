"""cdk-nag 3 acknowledgements: recorded next to the resource they concern, each with its own reason."""

from __future__ import annotations

import aws_cdk as cdk
from constructs import IConstruct

PACK = "AwsSolutions"


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Accept one finding (e.g. "AwsSolutions-IAM5[Resource::*]") on scope and its children."""
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=f"{PACK}::{rule}", reason=reason))
