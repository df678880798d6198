"""The job-notification topic: the functions publish when a job ends or is flagged for idle GPUs
(jobplane.deployment.notify); subscribe e-mail (jobplane:notifyEmail), chat or a queue to it. Only the functions may
publish."""

from __future__ import annotations

from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from constructs import Construct

NOTIFY_TOPIC_ENV = "JOBPLANE_NOTIFY_TOPIC"  # what jobplane.settings reads for the functions


class JobNotifications(Construct):
    def __init__(self, scope: Construct, construct_id: str, email: str | None) -> None:
        super().__init__(scope, construct_id)
        # Messages name jobs, owners and reasons: encrypted with the AWS-managed SNS key (no idle cost; its key
        # policy lets principals of this account use it through SNS, so publishers need no KMS grant).
        self.topic = sns.Topic(self, "Topic", display_name="jobplane jobs", enforce_ssl=True,
                               master_key=kms.Alias.from_alias_name(self, "SnsKey", "alias/aws/sns"))
        if email:
            self.topic.add_subscription(subs.EmailSubscription(email))

    def publishers(self, functions: dict[str, lambda_.Function]) -> None:
        for fn in functions.values():
            fn.add_environment(NOTIFY_TOPIC_ENV, self.topic.topic_arn)
            self.topic.grant_publish(fn)
