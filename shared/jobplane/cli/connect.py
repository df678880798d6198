"""How a registry command reaches the registry: the options that name it, a jobplane.sdk Client of it, and the
errors a user can cause or meet there, as one line.

The commands reach the registry only through the SDK (tests/cli/test_cli_sdk_boundary.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click
from click.core import ParameterSource
from rich.console import Console

if TYPE_CHECKING:
    from jobplane import sdk



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


def client(bucket: str | None, cloud: str | None, region: str | None, endpoint: str | None) -> sdk.Client:
    """The registry the options name, on its cloud: S3 and EC2, or GCS and Compute Engine."""
    from jobplane import sdk  # loaded by a command that runs (its models, a cloud's SDK): not by --help

    named = sdk.Client(bucket, cloud=cloud, region=region, progress=upload_progress)
    if named.cloud == "aws" and endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint  # before the client reaches anything: boto3 reads it then
    elif endpoint and click.get_current_context().get_parameter_source("endpoint") == ParameterSource.COMMANDLINE:
        raise UserError("--endpoint is for AWS; on GCP set STORAGE_EMULATOR_HOST (GCS) and JOBPLANE_COMPUTE_ENDPOINT "
                        "(the Compute Engine API)")
    return named


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
        from jobplane import sdk  # loaded by a command that runs (its models, a cloud's SDK): not by --help

        try:
            return func(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except sdk.BackendError as exc:
            raise UserError(f"BackendError: {exc} (or --region)") from None
        except sdk.JobplaneError as exc:
            raise UserError(str(exc)) from None
        except Exception as exc:  # the cloud SDKs' errors without importing an SDK here
            name = type(exc).__name__
            if name in ("NoCredentialsError", "EndpointConnectionError", "ClientError", "NoSuchBucket",
                        "ParamValidationError", "ConnectionClosedError", "NoRegionError") \
                    or type(exc).__module__.startswith(SDK_ERRORS):
                raise UserError(f"{name}: {exc}") from None
            raise
    return cast(F, wrapper)

