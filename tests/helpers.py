"""Small helpers shared by test packages."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from jobplane.local.triggers import LambdaContext
from jobplane.local.waiting import wait_for

# The one wait and the one Lambda context (the local cloud's), for tests that import their helpers from here.
__all__ = ["LambdaContext", "wait_for"]

if TYPE_CHECKING:
    import pytest

    from jobplane.clouds.base import ObjectStore
    from jobplane.model import keys
    from jobplane.model.metrics import Point
    from jobplane.store.registry import Registry
    from jobplane.store.rooted import RootedStore

WRITTEN = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)  # when the agent writes below say they were written


def imported(source: str, package: str, is_module: Callable[[str], bool]) -> set[str]:
    """Every module the source imports, wherever the import stands (at the top, in a function, under TYPE_CHECKING):
    `from a import b` counts as a.b where is_module(a.b), else as a; a relative import is resolved in `package` (the
    one the source is in); importlib.import_module("m") and __import__("m") with a literal name count as m. The
    boundary tests' scan (tests/test_layers.py, tests/cli/test_cli_sdk_boundary.py)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            if base != "__future__":
                found |= {f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base for a in node.names}
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))):
            found.add(node.args[0].value)
    return found


def table(*rows: dict[str, Any]) -> Any:
    """pytest.mark.parametrize over rows that name their values, table(dict(alias=..., expected=...), ...): a row
    reads on its own, and a column can be added without recounting positions."""
    import pytest

    names = list(rows[0])
    assert all(list(row) == names for row in rows), f"every row names {names}, in that order"
    return pytest.mark.parametrize(names, [tuple(row.values()) for row in rows])


def race(n: int, attempt: Callable[[int], object], lost: type[BaseException]) -> list[int]:
    """Call attempt(0..n-1) from n threads released together; return those whose call did not raise `lost`."""
    barrier, wins = threading.Barrier(n), []

    def run(i: int) -> None:
        barrier.wait(60)
        try:
            attempt(i)
            wins.append(i)
        except lost:
            pass

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return wins


def find_python(version: str) -> Path | None:
    """An interpreter of this version on this machine (on PATH, or one pyenv installed), else None."""
    on_path = shutil.which(f"python{version}")
    pyenv = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    for found in [*([Path(on_path)] if on_path else []), *pyenv]:
        probe = subprocess.run([str(found), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=60)
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return found
    return None


def vm_python(bin_dir: Path, base: Path | None = None) -> Path:
    """A `python3` for a stand-in VM: `base`, by default this machine's base interpreter (not the venv, where
    jobplane is importable), except that `python3 -m jobplane.agent` only reports where it would import the
    agent from."""
    base = base or Path(sys._base_executable).resolve()  # type: ignore[attr-defined]
    wrapper = bin_dir / "python3"
    wrapper.write_text(f"""#!/bin/bash
if [ "$1 $2" = "-m jobplane.agent" ]; then
  exec {base} -c 'import jobplane, os; print("agent import:", jobplane.__file__, os.environ["JOBPLANE_JOB_ID"])'
fi
exec {base} "$@"
""")
    wrapper.chmod(0o755)
    return wrapper


def power_shims(bin_dir: Path, log: Path) -> None:
    """shutdown/poweroff/halt that only record their arguments: a bootstrap run here must never power off."""
    for name in ("shutdown", "poweroff", "halt"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n')
        (bin_dir / name).chmod(0o755)


def run_bootstrap(script: str, tmp_path: Path, python: Path | None = None,
                  **env: str) -> subprocess.CompletedProcess[str]:
    """Run a rendered startup script as a VM would, with python3 (`python`, else this machine's) and power
    shims first on PATH and the agent unpacked under tmp_path instead of /opt/jobplane."""
    bin_dir = tmp_path / "vm-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    power_shims(bin_dir, tmp_path / "power.log")
    vm_python(bin_dir, python)
    path = f"{bin_dir}:/usr/bin:/bin"
    full = {"PATH": path, "HOME": str(tmp_path), "JOBPLANE_AGENT_HOME": str(tmp_path / "opt-jobplane"), **env}
    assert shutil.which("shutdown", path=path) == str(bin_dir / "shutdown")  # never the machine's
    return subprocess.run(["bash", "-c", script], env=full, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def publish_agent_manifest(reg: Any, cloud: str) -> None:
    """The manifest a deployment uploads with its agent bundles (x86_64 and aarch64, every alias's Python),
    for tests whose VMs never boot: the launcher reads only the manifest."""
    from jobplane.boot import agent_bundle
    from jobplane.model import images, keys

    variants = [agent_bundle.Variant(cloud, python, arch, "0" * 64, 1)
                for python in images.python_versions() for arch in images.ARCHITECTURES]
    reg.store.put(reg.key(keys.agent_file(agent_bundle.MANIFEST)), agent_bundle.manifest(variants))


class Crash(Exception):
    """The function dies here (injected)."""


def crash_on_event_writes(reg: Registry, monkeypatch: pytest.MonkeyPatch, kind: str) -> list[str]:
    """Make the create-only write of a `kind` event object die, as a function killed after its CAS would;
    returns the keys it refused."""
    from jobplane.model import keys

    refused: list[str] = []
    store, write = reg.store, reg.store.put_if_absent

    def dying(key: str, *args: Any, **kwargs: Any) -> str:
        event = keys.parse_event(key.removeprefix(reg.root))
        if event and event.kind == kind:
            refused.append(key)
            raise Crash(key)
        return write(key, *args, **kwargs)

    monkeypatch.setattr(store, "put_if_absent", dying)
    return refused


# ---- what an agent writes ----------------------------------------------------------------------------------------
def data_of(reg: RootedStore, job_id: str) -> keys.JobData:
    """Where the job's agents write its data: its record's say (JobRecord.data); a job with no record, jobs/<id>/."""
    from jobplane.model import keys
    from jobplane.store.registry import JobNotFound, read_job

    try:
        return read_job(reg, job_id)[0].data
    except JobNotFound:
        return keys.JobData(job_id)


def ship(reg: Registry, job_id: str, attempt: int, rank: int, seq: int, points: list[Point]) -> None:
    """A metrics chunk as the agent ships it, each point stamped WRITTEN + its step in seconds."""
    from jobplane.model import keys, metrics

    data = b"".join(metrics.encode(p, WRITTEN + timedelta(seconds=p.step or 0)) for p in points)
    reg.store.put_if_absent(reg.key(keys.metrics_chunk(data_of(reg, job_id), attempt, rank, seq)), data,
                            "application/x-ndjson")


def ship_system(reg: Registry, job_id: str, attempt: int, rank: int, seq: int,
                samples: list[dict[str, float]], every: float = 15, first: float = 0) -> None:
    """A system metrics chunk as the agent ships it: the samples `every` seconds apart from WRITTEN + first."""
    from jobplane.model import keys, sysmetrics

    data = b"".join(sysmetrics.encode(WRITTEN + timedelta(seconds=first + i * every), values)
                    for i, values in enumerate(samples))
    reg.store.put_if_absent(reg.key(keys.system_chunk(data_of(reg, job_id), attempt, rank, seq)), data,
                            "application/x-ndjson")


def gpu_sample(utilization: float, used: float, total: float = 24.0, gpus: int = 1) -> dict[str, float]:
    """One system sample of a node whose GPUs all read the same."""
    values = {"cpu_percent": 50.0, "memory_used_gb": 20.0, "memory_total_gb": 64.0, "disk_used_gb": 30.0}
    for i in range(gpus):
        values |= {f"gpu{i}.utilization": utilization, f"gpu{i}.memory_used_gb": used,
                   f"gpu{i}.memory_total_gb": total, f"gpu{i}.power_w": 70.0 + utilization}
    return values


def falling(steps: range, attempt_start: float = 8.0) -> list[Point]:
    """A step and a loss that falls 3% a step, at each of steps."""
    from jobplane.model.metrics import Point

    out = []
    for step in steps:
        out += [Point("step", float(step), step), Point("loss", attempt_start * 0.97 ** step, step)]
    return out


def publish(reg: Registry, job_id: str, area: str, files: dict[str, bytes]) -> None:
    """What the agent's publish() leaves: the files under artifacts/<area>/, then the area's manifest."""
    from jobplane.model import keys

    entries = {}
    for rel, data in files.items():
        version = reg.store.put(reg.key(f"{keys.artifacts_prefix(data_of(reg, job_id))}{area}/{rel}"), data)
        entries[rel] = {"key": rel, "size": len(data), "version": version}
    reg.put_json(f"{keys.artifacts_prefix(data_of(reg, job_id))}{area}.manifest.json",
                 {"written_at": WRITTEN.isoformat(), "files": entries})


def make_wheel(directory: Path, name: str, version: str, source: str) -> Path:
    """A minimal pure-Python wheel (one module named `name`), enough for pip and uv to install."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {f"{name}.py": source,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: jobplane-tests\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}

    def digest(text: str) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    record = "".join(f"{path},{digest(text)},{len(text.encode())}\n" for path, text in files.items())
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for member, text in {**files, f"{info}/RECORD": record + f"{info}/RECORD,,\n"}.items():
            whl.writestr(member, text)
    return path


# What a deployment on one cloud must never ship (agent bundles, the Lambda asset, the Cloud Functions zip):
# the other cloud's adapters, the local cloud and every fake, the CLI. Spelled out here, not taken from
# jobplane.boot.bundling, so a test of what bundling ships does not just repeat its rule.
NOT_SHIPPED = ("jobplane/local/", "jobplane/clouds/memory.py", "jobplane/clouds/aws_local.py", "jobplane/cli/",
               "jobplane/ops/backend.py", "jobplane/boot/bundling.py", "jobplane/ui/", "jobplane/sdk/")
OTHER_CLOUD = {"aws": ("jobplane/clouds/gcp.py", "jobplane/clouds/gcs.py", "jobplane/clouds/gce_metadata.py",
                       "jobplane/clouds/pubsub.py", "jobplane/clouds/gce_identity.py", "jobplane/clouds/gcp_vend.py",
                       "jobplane/clouds/gcs_downscope.py", "jobplane/clouds/gcp_secrets.py", "jobplane/vending/gcp.py"),
               "gcp": ("jobplane/clouds/aws.py", "jobplane/clouds/aws_ecr.py", "jobplane/clouds/aws_imds.py",
                       "jobplane/clouds/aws_vend.py", "jobplane/clouds/aws_secrets.py",
                       "jobplane/clouds/s3.py", "jobplane/clouds/sns.py", "jobplane/vending/aws_iam.py",
                       "jobplane/vending/aws.py")}


def unwanted(names: list[str], cloud: str, prefix: str = "") -> list[str]:
    """The members of a bundle for cloud (named prefix + jobplane/...) that must not be there: the other cloud's
    adapters, the local cloud, any fake, the CLI; and any jobplane module that imports the other cloud's SDK."""
    bad = tuple(prefix + n for n in (*NOT_SHIPPED, *OTHER_CLOUD[cloud]))
    return [n for n in names if n.startswith(bad) or "fake" in n.rsplit("/", 1)[-1]]


def foreign_sdk_imports(files: dict[str, str], cloud: str) -> list[str]:
    """Names of jobplane modules (name -> source) that import the other cloud's SDK."""
    import re

    sdk = r"google" if cloud == "aws" else r"boto3|botocore"
    pattern = re.compile(rf"^\s*(from|import)\s+({sdk})\b|import_module\(\"({sdk})\b", re.M)
    return [name for name, text in files.items() if pattern.search(text)]


@contextmanager
def http_server(what: str, argv: Sequence[str], probe: str, timeout: float = 60) -> Iterator[subprocess.Popen[bytes]]:
    """Run argv, a server, until the block ends (terminated, killed after 10 s): first wait until a GET of the URL
    `probe` gets any answer, failing at once, with the end of its stderr, if it exits before."""
    import requests

    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=stderr)

        def answers() -> bool:
            try:
                return requests.get(probe, timeout=1) is not None
            except requests.ConnectionError:
                return False

        def exited() -> str | None:
            if proc.poll() is None:
                return None
            stderr.seek(0)
            return f"it exited {proc.returncode}: {stderr.read()[-500:].decode(errors='replace')}"

        try:
            wait_for(what, answers, timeout, 0.05, abort=exited)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ---- what the launcher leaves of jobs refused by a full quota ----------------------------------------------------
def in_line(reg: Registry, jobs: list[tuple[str, str, int]], quota: int, now: datetime) -> None:
    """Each (job id, spec text, priority) recorded and admitted as the launcher does, a second apart: the first
    `quota` hold a node each (LAUNCHING), the others wait in their owner's line (WAITING_CAPACITY, the reason the
    admission gave)."""
    from jobplane.decide.admission import Quota, admit
    from jobplane.model import keys
    from jobplane.model.admission import Reservation
    from jobplane.model.spec import parse_spec
    from jobplane.model.states import State
    from jobplane.store import admission

    for n, (job_id, text, priority) in enumerate(jobs):
        spec = parse_spec(text, job_id)
        reg.create_job(job_id, spec, now)
        reg.transition(job_id, State.LAUNCHING, expect=[State.QUEUED], attempt=1)
        want = Reservation(job_id=job_id, attempt=1, owner=spec.owner, nodes=spec.num_nodes, at=now,
                           submitted=now + timedelta(seconds=n), priority=priority)
        quota_of = Quota(quota, f"owner {spec.owner!r}", "max_active_instances_per_owner")
        full = admission.change(reg, keys.admission_owner(spec.owner), lambda r, w=want, q=quota_of: admit(r, w, q))
        if full is not None:
            reg.transition(job_id, State.WAITING_CAPACITY, expect=[State.LAUNCHING], reason=full.reason)


# ---- a team member's credentials ---------------------------------------------------------------------------------
def member_store(store: ObjectStore, team: str, bucket: str = "reg", root: str = "") -> ObjectStore:
    """`store` as a member of `team` reaches it: each call evaluated against the stack's submitter policy
    (jobplane.vending.aws_iam.submitter_statements, the role tagged jobplane-owner=<team>) by the local cloud's IAM
    evaluator, an AccessDenied where IAM refuses, as the local moto answers such a session."""
    from jobplane.clouds.base import AccessDenied
    from jobplane.local import iam_policy
    from jobplane.model import keys
    from jobplane.vending import aws_iam

    policy = [aws_iam.document(aws_iam.submitter_statements(aws_iam.bucket_arn("aws", bucket),
                                                            keys.root_prefix(root)))]
    context = {f"aws:PrincipalTag/{aws_iam.OWNER_TAG}": team}

    def allowed(action: str, key: str) -> None:
        if iam_policy.evaluate(policy, action, f"arn:aws:s3:::{bucket}/{key}", context) != iam_policy.ALLOW:
            raise AccessDenied(f"access denied to {key}")

    class Member:
        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def get(self, key: str) -> Any:
            allowed("s3:GetObject", key)
            return store.get(key)

        def put(self, key: str, data: bytes, *args: Any, **kwargs: Any) -> str:
            allowed("s3:PutObject", key)
            return store.put(key, data, *args, **kwargs)

        def put_if_absent(self, key: str, data: bytes, *args: Any, **kwargs: Any) -> str:
            allowed("s3:PutObject", key)
            return store.put_if_absent(key, data, *args, **kwargs)

        def put_if_match(self, key: str, data: bytes, *args: Any, **kwargs: Any) -> str:
            allowed("s3:PutObject", key)
            return store.put_if_match(key, data, *args, **kwargs)

        def delete(self, key: str) -> None:
            allowed("s3:DeleteObject", key)
            store.delete(key)

        def upload_file(self, key: str, *args: Any, **kwargs: Any) -> Any:
            allowed("s3:PutObject", key)
            return store.upload_file(key, *args, **kwargs)

        def download_file(self, key: str, *args: Any, **kwargs: Any) -> Any:
            allowed("s3:GetObject", key)
            return store.download_file(key, *args, **kwargs)

    return cast("ObjectStore", Member())


@contextmanager
def in_tmpfs(prefix: str, fallback: Path) -> Iterator[Path]:
    """A fresh directory in tmpfs (/dev/shm) where it is writable, removed at the end; else fallback: for a test
    whose rewritten files would start the disk's write-back, which slows every other test's writes."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield fallback
        return
    where = Path(tempfile.mkdtemp(prefix=prefix, dir=shm))
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)
