"""The jobplane stack: the control plane construct configured from cdk.json context."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from constructs import Construct

from infra.aws.config import ControlPlaneConfig
from infra.aws.control_plane import JobplaneControlPlane
from infra.aws.nag import acknowledge

BOOTSTRAP_QUALIFIER = "@aws-cdk/core:bootstrapQualifier"


class JobplaneStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, config: ControlPlaneConfig | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("description", "jobplane: serverless control plane for ML training on EC2")
        super().__init__(scope, construct_id, **kwargs)
        self.control_plane = JobplaneControlPlane(self, "ControlPlane", config or ControlPlaneConfig.from_context(self))
        self._acknowledge_cdk_internals()

    def _assets_bucket(self) -> str:
        """The CDK bootstrap assets bucket as cdk-nag prints it: literal account/region when the CLI knows
        them (cdk deploy), pseudo-parameters when synthesized environment-agnostic (make synth, tests)."""
        qualifier = self.node.try_get_context(BOOTSTRAP_QUALIFIER) or cdk.DefaultStackSynthesizer.DEFAULT_QUALIFIER
        account = "<AWS::AccountId>" if cdk.Token.is_unresolved(self.account) else self.account
        region = "<AWS::Region>" if cdk.Token.is_unresolved(self.region) else self.region
        return f"cdk-{qualifier}-assets-{account}-{region}"

    def _acknowledge_cdk_internals(self) -> None:
        """Findings on the singleton Lambdas CDK adds for us: the BucketDeployment uploader (agent bundles and
        policy.yaml, runs only during deployments) and the bucket-notifications handler (turns EventBridge
        notifications on). Their code and roles are CDK's, not ours."""
        basic_role = ("AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                      "AWSLambdaBasicExecutionRole]")
        for child in self.node.children:
            name = child.node.id
            if name.startswith("BucketNotificationsHandler"):
                acknowledge(child, basic_role, "CDK's bucket-notifications handler only logs with this policy; "
                                               "it runs during deployments.")
            if not name.startswith("Custom::CDKBucketDeployment"):
                continue
            acknowledge(child, basic_role, "CDK's BucketDeployment uploader only logs with this policy; it runs "
                                           "during deployments.")
            acknowledge(child, "AwsSolutions-L1", "CDK's BucketDeployment uploader pins its own runtime (it "
                                                  "bundles the AWS CLI); it runs only during deployments.")
            uploads = ("CDK's BucketDeployment uploader copies the asset zip from the CDK assets bucket into "
                       "system/agent/ and config/ of the registry, syncing (and pruning) whole prefixes.")
            for finding in ("Action::s3:GetObject*", "Action::s3:GetBucket*", "Action::s3:List*",
                            "Action::s3:DeleteObject*", "Action::s3:Abort*",
                            f"Resource::arn:<AWS::Partition>:s3:::{self._assets_bucket()}/*",
                            f"Resource::<{self.control_plane.bucket_id()}.Arn>/*"):
                acknowledge(child, f"AwsSolutions-IAM5[{finding}]", uploads)
