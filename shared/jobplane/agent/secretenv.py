"""A job's secrets on its VM: read with the job's own credentials (whose grant names exactly the secrets its spec
names), given to its phases as variables or as 0400 files on a tmpfs, and handed to the output's redaction.
Never on a command line, never in the bucket: a container gets them as `--env NAME` with the value in the runtime
client's environment (model/containers.run_argv)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from jobplane.model.spec import JobSpec

TMPFS = Path("/dev/shm")  # memory-backed on every Linux: a file there never reaches a disk


class SecretError(ValueError):
    """A secret the job cannot use, naming the spec's field."""


def read_all(spec: JobSpec, read: Callable[[str, str], bytes]) -> dict[str, bytes]:
    """Each secret the spec names (by name), read once."""
    return {name: read(spec.owner, name) for name in spec.secret_names}


def dir_path(job_id: str, rank: int, tmpfs: Path = TMPFS) -> Path:
    return tmpfs / f"jobplane-secrets-{job_id}-{rank}"


def secrets_dir(job_id: str, rank: int, tmpfs: Path = TMPFS) -> Path:
    """The job's own 0700 directory on the tmpfs, for its file secrets (a container mounts it too)."""
    if not tmpfs.is_dir():
        raise SecretError(f"secrets: {tmpfs} (a tmpfs) is missing on this VM: a file secret needs it")
    directory = dir_path(job_id, rank, tmpfs)
    directory.mkdir(mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    return directory


def variables(spec: JobSpec, values: dict[str, bytes], directory: Callable[[], Path]) -> dict[str, str]:
    """The variables `secrets:` gives the phases: the value itself, or a file's path (the file written 0400)."""
    env: dict[str, str] = {}
    for var, ref in spec.secrets.items():
        value = values[ref.name]
        if ref.file:
            path = directory() / var
            path.unlink(missing_ok=True)  # a restarted agent writes it again
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as file:
                file.write(value)
            env[var] = str(path)
        elif b"\0" in value:
            raise SecretError(f"secrets.{var}: secret {ref.name!r} holds a NUL byte, which no environment variable "
                              f"can: give it as a file ({{name: {ref.name}, file: true}})")
        else:
            env[var] = os.fsdecode(value)  # any bytes: the process gets them back as they were
    return env


def registry_login(spec: JobSpec, values: dict[str, bytes]) -> tuple[str, str] | None:
    """container.registry_auth's user:token, or None without one."""
    name = spec.container.registry_auth if spec.container is not None else None
    if not name:
        return None
    user, colon, token = values[name].decode(errors="replace").strip().partition(":")
    if not colon or not user or not token:
        raise SecretError(f"container.registry_auth: secret {name!r} is not user:token")
    return user, token


def clean(job_id: str, rank: int, tmpfs: Path = TMPFS) -> None:
    """The file secrets removed once the job's processes are over."""
    shutil.rmtree(dir_path(job_id, rank, tmpfs), ignore_errors=True)
