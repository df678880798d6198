"""How a registry command reaches the registry: the options that name it, connecting to it on its cloud, and
the errors a user can cause or meet there, as one line."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import click
from click.core import ParameterSource
from rich.console import Console

from jobplane import jobs
from jobplane.registry import JobExists, JobNotFound, TransitionRefused
from jobplane.settings import Settings


class UserError(click.ClickException):
    """One clear line and exit 1 (ClickException prints 'Error: ...')."""


F = TypeVar("F", bound=Callable[..., Any])


def registry_options(func: F) -> F:
    """--bucket / --cloud / --region / --endpoint, each defaulting to the environment a `local up` writes."""
    func = click.option("--endpoint", envvar="AWS_ENDPOINT_URL",
                        help="AWS only: S3/EC2 endpoint URL, e.g. the local cloud's (env AWS_ENDPOINT_URL). On GCP "
                             "set STORAGE_EMULATOR_HOST and JOBPLANE_COMPUTE_ENDPOINT.")(func)
    func = click.option("--region", help="The deployment's region (env JOBPLANE_REGION; on AWS also AWS_REGION).")(func)
    func = click.option("--cloud", type=click.Choice(["aws", "gcp"]),
                        help="Cloud of a bare bucket name (env JOBPLANE_CLOUD; default aws); s3:// and gs:// URLs "
                             "say it themselves.")(func)
    func = click.option("--bucket", envvar="JOBPLANE_BUCKET",
                        help="Registry: s3://BUCKET[/ROOT], gs://BUCKET[/ROOT] or a bucket name (env "
                             "JOBPLANE_BUCKET).")(func)
    return func


def connect(bucket: str | None, cloud: str | None, region: str | None, endpoint: str | None) -> jobs.Backend:
    """The registry the options name, on its cloud: S3 and EC2, or GCS and Compute Engine (jobplane.backend)."""
    from jobplane import backend

    try:
        settings = Settings.from_env(bucket, cloud, region)
    except RuntimeError as exc:
        raise UserError(str(exc)) from None
    if settings.cloud == "aws" and endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
    elif endpoint and click.get_current_context().get_parameter_source("endpoint") == ParameterSource.COMMANDLINE:
        raise UserError("--endpoint is for AWS; on GCP set STORAGE_EMULATOR_HOST (GCS) and JOBPLANE_COMPUTE_ENDPOINT "
                        "(the Compute Engine API)")
    return backend.connect(settings, upload_progress)


@contextlib.contextmanager
def upload_progress(path: Path) -> Iterator[Callable[[int], None]]:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(TextColumn("uploading code"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=Console(stderr=True), transient=False) as progress:
        task = progress.add_task("code", total=path.stat().st_size)
        yield lambda sent: progress.advance(task, sent)


# Google's libraries: an API refusal (google.api_core), no credentials (google.auth), GCS unreachable (requests)
SDK_ERRORS = ("google.api_core.", "google.auth.", "google.cloud.", "requests.exceptions")


def cloud_errors(func: F) -> F:
    """Turn the errors a user can cause or meet (no bucket, no credentials, unknown job) into one line."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except (JobNotFound, JobExists, TransitionRefused, jobs.JobError) as exc:
            raise UserError(str(exc)) from None
        except Exception as exc:  # the cloud SDKs' errors without importing an SDK here
            name = type(exc).__name__
            if name in ("NoCredentialsError", "EndpointConnectionError", "ClientError", "NoSuchBucket",
                        "ParamValidationError", "ConnectionClosedError", "NoRegionError", "BackendError") \
                    or type(exc).__module__.startswith(SDK_ERRORS):
                raise UserError(f"{name}: {exc}") from None
            raise
    return cast(F, wrapper)
