"""The EventBridge events the handlers receive, typed: what each tells a handler (which job or instance to
look at now) and what a manual invocation asks for.

S3 "Object Created" is Powertools' S3EventBridgeNotificationEvent. Powertools has no class for EC2's events,
so the two the stack routes here are typed below the same way (a DictWrapper over the raw event):
"EC2 Instance State-change Notification" (sweeper) and "EC2 Spot Instance Interruption Warning" (rerun).
"""

from __future__ import annotations

from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent, S3EventBridgeNotificationEvent
from aws_lambda_powertools.utilities.data_classes.common import DictWrapper

from functions.aws import common
from jobplane.model import keys
from jobplane.settings import Settings

SCHEDULED = "Scheduled Event"
OBJECT_CREATED = "Object Created"
STATE_CHANGE = "EC2 Instance State-change Notification"
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"


class Ec2InstanceDetail(DictWrapper):
    @property
    def instance_id(self) -> str:
        return str(self["instance-id"])

    @property
    def state(self) -> str | None:
        """A state change's new state (pending, running, shutting-down, terminated, stopping, stopped)."""
        return self.get("state")

    @property
    def instance_action(self) -> str | None:
        """A Spot warning's action: terminate, stop or hibernate."""
        return self.get("instance-action")


class Ec2InstanceEvent(EventBridgeEvent):
    """An EC2 state-change notification or Spot interruption warning (source aws.ec2). `detail` stays the
    EventBridge event's plain dict; `instance` is the same detail, typed."""

    @property
    def instance(self) -> Ec2InstanceDetail:
        return Ec2InstanceDetail(self["detail"])


def kind(event: EventBridgeEvent) -> str | None:
    """The event's detail-type; None for a manual invocation ({"dry_run": true}), which has none."""
    return event.get("detail-type")


def ec2_event(event: EventBridgeEvent, detail_type: str) -> Ec2InstanceEvent | None:
    """The event as an EC2 one if it is of that detail-type (STATE_CHANGE or SPOT_WARNING), else None."""
    return Ec2InstanceEvent(event.raw_event) if kind(event) == detail_type else None


def registry_key(event: EventBridgeEvent, settings: Settings) -> str | None:
    """The registry-relative key of an S3 "Object Created" event in our bucket (under the root), else None."""
    if kind(event) != OBJECT_CREATED:
        return None
    detail = S3EventBridgeNotificationEvent(event.raw_event).detail
    key = detail.object.key
    if detail.bucket.name != settings.bucket:
        return None
    root = settings.root.strip("/")
    if not root:
        return key
    return key.removeprefix(root + "/") if key.startswith(root + "/") else None


def named_job(event: EventBridgeEvent, settings: Settings) -> str | None:
    """The job an exit-report or preempted-jobs/ object event names (then on every log line), else None."""
    job = keys.job_named_by(registry_key(event, settings))
    if job:
        common.logger.append_keys(job_id=job)
    return job


def flag(event: EventBridgeEvent, name: str) -> bool:
    """A manual invocation's option: {"dry_run": true} looks without acting, {"force": true} skips grace."""
    return bool(event.get(name))
