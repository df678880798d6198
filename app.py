#!/usr/bin/env python3
"""CDK entry point: `cdk synth` / `cdk deploy` the jobplane control plane on AWS (settings: cdk.json)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "shared"))

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra.aws.stack import JobplaneStack

app = cdk.App()
JobplaneStack(
    app,
    "Jobplane",
    env=cdk.Environment(account=os.environ.get("CDK_DEFAULT_ACCOUNT"), region=os.environ.get("CDK_DEFAULT_REGION")),
)
# cdk-nag runs on every synth: an unacknowledged finding stops it.
cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
app.synth()
