"""Cloud Functions (gen2) entry points: the same launcher and reconcilers as on AWS, over GCS and GCE.

launcher          CloudEvent google.cloud.storage.object.v1.finalized (the registry bucket): queue/ drops
                  launch, cancels/ requests carry out a team member's cancel (jobplane.control.cancels); exit
                  reports get a targeted scheduled pass (the check, and their sweep's reconcile) and
                  preempted-jobs/ markers a rerun, as the AWS EventBridge rules do (GCS triggers are bucket-wide,
                  so one function routes them)
launcher_backstop HTTP, Cloud Scheduler: queue/ entries and cancels/ requests events missed, capacity waits
                  that are over
sweeper, rerun, uptime_cap   HTTP, Cloud Scheduler with an OIDC token (the functions allow no
                  unauthenticated calls); an optional JSON body {"dry_run": true, "force": true}.
vend              HTTP, called by job VMs (only their service account may invoke it): a VM's identity token
                  for the job's storage credentials (jobplane.vending.gcp).
Deployed from a source zip whose root holds this file as main.py plus the jobplane package.
Metrics go to the log as one structured line each (LogMetrics); log-based metrics pick them up.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import flask
import functions_framework
from cloudevents.http import CloudEvent

from jobplane.clouds import gce_identity, gcs_downscope
from jobplane.clouds.gcp import GceCompute
from jobplane.clouds.gcp_secrets import SecretManager, secret_manager
from jobplane.clouds.gcs import GcsStore, access_token_credentials
from jobplane.clouds.pubsub import PubSubNotifier
from jobplane.control import cancels, reconcile, scheduled
from jobplane.control import launcher as launching
from jobplane.deployment.context import Adapters, Deployment, build
from jobplane.deployment.telemetry import LogMetrics
from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.settings import Settings
from jobplane.vending import gcp as gcp_vending

metrics = LogMetrics()
# The GCS client and the Pub/Sub session are reused across invocations.
_stores: dict[tuple[str, str | None, str | None], GcsStore] = {}
_notifiers: dict[tuple[str, str | None], PubSubNotifier] = {}


class _CloudLoggingFormatter(logging.Formatter):
    """One JSON object per line: Cloud Logging reads severity and message, and keeps job_id and a bucket
    event's result (what the launcher or reconciler did) as searchable fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"severity": record.levelname, "message": record.getMessage(), "logger": record.name}
        entry.update({k: getattr(record, k) for k in ("job_id", "result", "metric", "value", "unit")
                      if hasattr(record, k)})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _configure_logging() -> None:
    """Once per process, even if the framework loads this file again."""
    logger = logging.getLogger("jobplane")
    if not any(h.name == "jobplane-gcp" for h in logger.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.name = "jobplane-gcp"
        handler.setFormatter(_CloudLoggingFormatter())
        logger.addHandler(handler)
    logger.setLevel(os.environ.get("JOBPLANE_LOG_LEVEL", "INFO"))


_configure_logging()


def _store(settings: Settings) -> GcsStore:
    key = (settings.bucket, settings.project, settings.gcs_token)
    if key not in _stores:  # with the token JOBPLANE_GCS_TOKEN gives (the local cloud's), else the service account's
        credentials = access_token_credentials(settings.gcs_token) if settings.gcs_token else None
        _stores[key] = GcsStore(settings.bucket, project=settings.project, credentials=credentials)
    return _stores[key]


def _notifier(settings: Settings) -> PubSubNotifier | None:
    """The topic JOBPLANE_NOTIFY_TOPIC names (projects/<project>/topics/<name>, made by infra/gcp), or None."""
    if not settings.notify_topic:
        return None
    key = (settings.notify_topic, settings.pubsub_emulator)
    if key not in _notifiers:
        _notifiers[key] = PubSubNotifier(settings.notify_topic, emulator=settings.pubsub_emulator)
    return _notifiers[key]


# The backstop function times out at 540 s (infra/gcp); an insert operation may take up to 300 s of that.
BACKSTOP_BUDGET_S = 200

ADAPTERS = Adapters(store=_store, notifier=_notifier,
                               compute=lambda settings, policy: GceCompute.from_settings(settings, policy.gcp))


def environment() -> Deployment:
    """Fresh per invocation (the policy may have changed)."""
    return build(Settings.from_env(), ADAPTERS, metrics)


def registry_key(data: dict[str, Any], settings: Settings) -> str | None:
    """The registry-relative key of a finalized object in our bucket (under the root), else None."""
    name, root = data.get("name"), settings.root.strip("/")
    if data.get("bucket") != settings.bucket or not isinstance(name, str):
        return None
    key = name.removeprefix(root + "/") if root and name.startswith(root + "/") else (None if root else name)
    return key or None


def _options(request: flask.Request) -> dict[str, bool]:
    body = request.get_json(silent=True) or {}
    return {"dry_run": bool(body.get("dry_run")), "force": bool(body.get("force"))}


@functions_framework.cloud_event
def launcher(event: CloudEvent) -> None:
    key = registry_key(event.data or {}, Settings.from_env())
    job_id = keys.job_named_by(key)
    if key is None or not (key.startswith((keys.QUEUE, keys.CANCELS)) or job_id):
        return  # heartbeats, logs, checkpoints: every object write in the bucket fires this trigger
    env, log = environment(), logging.getLogger("jobplane")
    if key.startswith(keys.CANCELS):  # a team member's cancel request
        done = cancels.handle(env.context(), key, now=utcnow())
        log.info("%s: %s", key, done.result, extra={"job_id": done.subject, "result": launching.summary([done])})
        return
    if key.startswith(keys.QUEUE):
        outcome = launching.handle_drop(env.context(), key, now=utcnow())
        drop = keys.parse_drop(key)
        log.info("%s: %s", key, outcome.result, extra={"job_id": drop.job_id if drop else None,
                                                       "result": launching.summary([outcome])})
        return
    if key.startswith(keys.PREEMPTED):
        summary = reconcile.summary(reconcile.rerun(env.context(), now=utcnow(), jobs=[job_id] if job_id else []))
    else:
        summary = scheduled.summary(scheduled.run(env.context(), now=utcnow(), jobs=[job_id] if job_id else []))
    log.info("%s: %s", key, summary, extra={"job_id": job_id, "result": summary})


@functions_framework.http
def launcher_backstop(request: flask.Request) -> flask.Response:
    env = environment()
    return flask.jsonify(launching.summary(launching.backstop(env.context(), now=utcnow(), budget=BACKSTOP_BUDGET_S)))


@functions_framework.http
def sweeper(request: flask.Request) -> flask.Response:
    """The scheduled pass (jobplane.control.scheduled): the check, then the sweeps' reconcile."""
    env, opts = environment(), _options(request)
    done = scheduled.run(env.context(dry_run=opts["dry_run"]), now=utcnow(), force=opts["force"])
    return flask.jsonify(scheduled.summary(done))


@functions_framework.http
def rerun(request: flask.Request) -> flask.Response:
    env, opts = environment(), _options(request)
    outcomes = reconcile.rerun(env.context(dry_run=opts["dry_run"]), now=utcnow())
    return flask.jsonify(reconcile.summary(outcomes))


@functions_framework.http
def uptime_cap(request: flask.Request) -> flask.Response:
    env, opts = environment(), _options(request)
    outcomes = reconcile.uptime_cap(env.context(dry_run=opts["dry_run"]), now=utcnow(), force=opts["force"])
    return flask.jsonify(reconcile.summary(outcomes))


def vend_config(settings: Settings, project: str) -> gcp_vending.VendConfig:
    """JOBPLANE_VEND_URL is this function's URL, the audience of the VMs' tokens; the VMs' service account and,
    in the local cloud only, its fakes of Google's certificates and STS come from the environment too."""
    return gcp_vending.VendConfig(
        audience=settings.vend_url or "", project=project,
        service_account=os.environ.get("JOBPLANE_VM_SERVICE_ACCOUNT", ""),
        certs_url=os.environ.get("JOBPLANE_GOOGLE_CERTS_URL") or gce_identity.GOOGLE_CERTS_URL,
        sts_url=os.environ.get("JOBPLANE_STS_URL") or gcs_downscope.GOOGLE_STS_URL)


def _own_token(config: gcp_vending.VendConfig, given: str | None) -> str:
    """The function's own access token; the local cloud's fake STS narrows the one the cloud gives its functions
    (`given`, JOBPLANE_GCS_TOKEN's: their service account's), and takes any other as unenforced."""
    if config.sts_url != gcs_downscope.GOOGLE_STS_URL:
        return given or "jobplane-local-functions"
    return gcs_downscope.own_access_token()


def _secret_store(settings: Settings, project: str) -> SecretManager:
    """Secret Manager with the function's own identity (the local cloud's fake with the functions' token)."""
    endpoint = os.environ.get("JOBPLANE_SECRETS_ENDPOINT") or None
    return secret_manager(project, settings.deployment, endpoint, "jobplane-local-functions" if endpoint else None)


@functions_framework.http
def vend(request: flask.Request) -> flask.Response:
    env = environment()
    if not isinstance(env.compute, GceCompute):
        raise TypeError(f"vend needs Compute Engine, not {type(env.compute).__name__}")
    config = vend_config(env.settings, env.compute.project)
    cloud = gcp_vending.Cloud(
        verify=lambda token: gce_identity.verify(token, audience=config.audience,
                                                 service_account=config.service_account,
                                                 certs_url=config.certs_url),
        vms=env.compute,
        downscope=lambda scope: gcs_downscope.exchange(scope, _own_token(config, env.settings.gcs_token),
                                                       config.sts_url),
        secrets=lambda owner, name: _secret_store(env.settings, config.project).get(owner, name))
    answer = gcp_vending.vend(request.get_json(silent=True), request.headers.get("Authorization"), config=config,
                              registry=env.registry, deployment=env.settings.deployment, cloud=cloud)
    response = flask.jsonify(answer.body)
    response.status_code = answer.status
    return response
