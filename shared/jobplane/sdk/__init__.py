"""jobplane's Python SDK: submit jobs to a registry, watch them, read their output, metrics, cost and artifacts,
cancel them. The `jobplane` command is built on it (tests/cli/test_cli_sdk_boundary.py keeps it so).

    from jobplane import Client

    client = Client("s3://my-bucket")              # or Client() for JOBPLANE_BUCKET, as the CLI
    job = client.submit("examples/demo.yaml", code="examples/train", hyperparameters={"lr": 0.02})
    job.wait(600)                                  # State.SUCCEEDED, or how it ended; Timeout past 600 s
    job.metrics()["loss"].last
    for line in job.logs():
        print(line)

A spec with a `sweep:` section submits a sweep: `client.sweep(id)` follows it (its trials are jobs); one with
`array:` an array, `client.array(id)` (its members are jobs, <id>-0, <id>-1, ...).

Every error it raises on purpose is a JobplaneError: JobNotFound, SweepNotFound, InvalidSpec (with the field
errors), Timeout, Refused (NotYours for another team's job), ConfigurationError (BackendError for the VM API).
"""

from jobplane.decide.budget import Budget
from jobplane.model.errors import FieldError
from jobplane.model.metrics import Sample
from jobplane.model.states import State
from jobplane.ops.cancels import Cancelled
from jobplane.ops.jobs import Artifact, Checkpoint, Submission
from jobplane.ops.queue import Standing
from jobplane.sdk.client import Client, TensorBoardCopy, UploadProgress, prepare
from jobplane.sdk.errors import (
    BackendError,
    ConfigurationError,
    InvalidSpec,
    JobExists,
    JobNotFound,
    JobplaneError,
    NotYours,
    Refused,
    SweepNotFound,
    Timeout,
)
from jobplane.sdk.job import Job, Lifetime, LogLine, Metric, Stored
from jobplane.sdk.sweep import Sweep, TrialRow
from jobplane.sdk.watch import Output, Watch
from jobplane.views.jobview import JobView, Status

__all__ = [
    "Artifact", "BackendError", "Budget", "Cancelled", "Checkpoint", "Client", "ConfigurationError", "FieldError",
    "InvalidSpec", "Job", "JobExists", "JobNotFound", "JobView", "JobplaneError", "Lifetime", "LogLine", "Metric",
    "NotYours", "Output", "Refused", "Sample", "Standing", "State", "Status", "Stored", "Submission", "Sweep",
    "SweepNotFound", "TensorBoardCopy", "Timeout", "TrialRow", "UploadProgress", "Watch", "prepare",
]
