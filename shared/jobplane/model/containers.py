"""A job's container: which references and runtime options a spec may give, and the command lines the agent
runs (pull, run, remove). Pure: the agent (jobplane.agent.container) runs them.

The job's processes run in the container with the VM's network (multi-node rendezvous on the hosts' own
addresses), the VM's GPUs, and the job's directories bind-mounted at the paths they have on the VM, so the
agent's checkpoint rules (which files a process holds open, read from /proc) see the same paths inside and
out. Every variable the job gets is passed by name (`-e NAME`), its value taken from the runtime's own
environment: no value shows in a process listing. Each container carries a marker variable, by which the
agent finds its processes to freeze and signal them as it does a job's process group: the runtime's
monitor process runs in its own session, out of reach of a signal to the group.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

RUNTIMES = ("podman", "docker")  # tried in this order on the VM
MARKER = "JOBPLANE_CONTAINER"  # set in every container process's environment: its name
DOCKER_SCHEME = "docker://"

_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]{{1,5}})?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REFERENCE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_PATH_PART}(?:/{_PATH_PART})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")
MAX_REFERENCE = 512

# Options jobplane sets itself: the job's container must be found, stopped and removed by name, share the
# VM's network, run our command and go away with its VM.
OWNED_OPTIONS = ("--name", "--rm", "--network", "--net", "--pull", "--init", "--detach", "-d", "--entrypoint",
                 "--interactive", "-i", "--tty", "-t", "--workdir", "-w", "--env-host", "--sig-proxy")
MAX_OPTIONS = 32
# Short options that take a value in both runtimes' run (-a -c -e -h -l -m -p -u -v -w): in a cluster the rest of
# the argument after one is its value (-eFOO=1, -itw/x). Any other letter is read as a flag, so an owned one
# (-d, -i, -t, -w) is found wherever a cluster hides it (-itd, -dt); a letter read wrongly as a flag can only refuse
# more, never let an owned option through.
SHORT_WITH_VALUE = frozenset("acehlmpuvw")


def reference_problem(image: str) -> str | None:
    """Why `image` is not a container image reference (REGISTRY/NAME:TAG, NAME@sha256:...), or None."""
    if image.startswith(DOCKER_SCHEME):
        image = image[len(DOCKER_SCHEME):]
    if len(image) > MAX_REFERENCE:
        return f"longer than {MAX_REFERENCE} characters"
    m = REFERENCE.match(image)
    if not m or (m.group("domain") and not _host_like(m.group("domain")) and not re.fullmatch(_PATH_PART,
                                                                                             m.group("domain"))):
        return (f"{image!r} is not an image reference: [REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST], lowercase "
                "name (e.g. pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime, 123456789012.dkr.ecr.us-east-1."
                "amazonaws.com/train:v3)")
    return None


def normalize(image: str) -> str:
    """The reference as runtimes take it: without a docker:// prefix."""
    return image[len(DOCKER_SCHEME):] if image.startswith(DOCKER_SCHEME) else image


def _host_like(domain: str) -> bool:
    """As Docker reads a reference: its first component is a registry only if it looks like a host."""
    return "." in domain or ":" in domain or domain == "localhost"


def registry_host(image: str) -> str:
    """The registry a reference pulls from (docker.io when it names none)."""
    m = REFERENCE.match(normalize(image))
    domain = m.group("domain") if m else None
    return domain if domain and _host_like(domain) else "docker.io"


def fully_qualified(image: str) -> str:
    """podman refuses short names without a search list: docker.io/library/python:3.12 for python:3.12."""
    image = normalize(image)
    m = REFERENCE.match(image)
    domain = m.group("domain") if m else None
    if domain and _host_like(domain):
        return image
    return f"docker.io/{image}" if "/" in image else f"docker.io/library/{image}"


def option_problem(option: str) -> str | None:
    """Why a runtime option from `container.args` is refused, or None."""
    if not option.startswith("-") or option == "-":
        return f"{option!r} is not an option: args are the runtime's run options (e.g. --shm-size=16g, --ipc=host)"
    if option == "--":
        return "'--' ends the runtime's options: jobplane's own (the entrypoint, the image) must follow"
    names = [option.split("=", 1)[0]] if option.startswith("--") else _short_names(option)
    if owned := next((name for name in names if name in OWNED_OPTIONS), None):
        return f"{owned} is set by jobplane (the job's container is named, removed, on the VM's network, runs setup " \
               "and run in its working directory, and the job ends when it exits)"
    if not option.startswith("--") and names[-1][1] in SHORT_WITH_VALUE and len(option) == len(names) + 1:
        return f"{names[-1]} needs its value in the same argument ({names[-1]}VALUE): the next one is jobplane's"
    return None


def _short_names(option: str) -> list[str]:
    """The options a short-option argument gives, as the runtimes read it: -itd is -i -t -d; -eFOO=1 is -e with the
    value FOO=1; -w=/x and -w/x are -w with a value."""
    names: list[str] = []
    for letter in option[1:]:
        names.append(f"-{letter}")
        if letter in SHORT_WITH_VALUE or letter == "=":
            break
    return names


def name_for(job_id: str, attempt: int, rank: int) -> str:
    return f"jobplane-{job_id}-{attempt}-{rank}"


def run_argv(runtime: str, *, image: str, name: str, command: str, workdir: Path, mounts: Iterable[Path],
             env_names: Iterable[str], options: Iterable[str] = (), gpus: int = 0) -> list[str]:
    """`<runtime> run` for one phase (setup or run) of the job: the command in `bash -c` (`sh -c` when the
    image has no bash), as the job's shell would run it on the VM."""
    argv = [runtime, "run", "--rm", "--init", "--network", "host", "--pull", "never", "--name", name,
            "--env", MARKER, "--workdir", str(workdir)]
    for path in sorted(set(mounts)):
        argv += ["--volume", f"{path}:{path}"]
    for key in sorted(set(env_names)):
        argv += ["--env", key]
    if gpus:
        argv += ["--gpus", "all"] if runtime.endswith("docker") else ["--device", "nvidia.com/gpu=all"]
    launcher = 'if command -v bash >/dev/null 2>&1; then exec bash -c "$0"; else exec sh -c "$0"; fi'
    return [*argv, *options, "--entrypoint", "/bin/sh", fully_qualified(image), "-c", launcher, command]


def pull_argv(runtime: str, image: str) -> list[str]:
    return [runtime, "pull", fully_qualified(image)]


def login_argv(runtime: str, host: str, user: str) -> list[str]:
    """The password goes to stdin, never argv."""
    return [runtime, "login", "--username", user, "--password-stdin", host]


def remove_argv(runtime: str, name: str) -> list[str]:
    return [runtime, "rm", "--force", name]


def env_names(env: Mapping[str, str]) -> list[str]:
    """What a container is given of the job's environment: the job's own variables, not the VM's PATH, HOME
    or the agent's settings (the image has its own PATH and home)."""
    vm_only = {"PATH", "HOME", "PWD", "OLDPWD", "SHLVL", "HOSTNAME", "TMPDIR", "VIRTUAL_ENV", "PYTHONHOME", "_"}
    return [k for k in env if k not in vm_only]
