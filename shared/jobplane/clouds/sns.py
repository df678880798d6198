"""Notifier over an SNS topic (boto3): e-mail subscribers get the text, every other protocol the JSON data."""

from __future__ import annotations

import json
from typing import Any

import boto3
from botocore.config import Config

from jobplane.clouds.base import Notice

RETRIES = Config(retries={"mode": "standard", "max_attempts": 3})
SUBJECT_MAX = 100  # SNS: ASCII, at most 100 characters


def sns_client(region: str | None = None) -> Any:
    """A client honouring AWS_ENDPOINT_URL (moto server, local cloud)."""
    return boto3.client("sns", region_name=region, config=RETRIES)


class SnsNotifier:
    def __init__(self, topic_arn: str, client: Any = None) -> None:
        self.topic_arn = topic_arn
        self.client = client or sns_client(topic_arn.split(":")[3] or None)

    def publish(self, notice: Notice) -> None:
        data = json.dumps({**notice.data, "subject": notice.subject, "text": notice.text}, default=str)
        attributes = {name: {"DataType": "String", "StringValue": str(notice.data[name])}
                      for name in ("event", "job_id", "state", "owner") if notice.data.get(name)}
        self.client.publish(
            TopicArn=self.topic_arn, Subject=notice.subject.encode("ascii", "replace").decode()[:SUBJECT_MAX],
            Message=json.dumps({"default": data, "email": notice.text}), MessageStructure="json",
            MessageAttributes=attributes)
