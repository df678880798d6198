"""The jobplane stack. Grows issue by issue; today: the registry bucket."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_s3 as s3
from constructs import Construct


class JobplaneStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        name = self.node.try_get_context("jobplane:bucketName") or None
        self.bucket = s3.Bucket(
            self,
            "Registry",
            bucket_name=name,
            versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            encryption=s3.BucketEncryption.S3_MANAGED,
            event_bridge_enabled=True,
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
        cdk.CfnOutput(self, "BucketName", value=self.bucket.bucket_name)
