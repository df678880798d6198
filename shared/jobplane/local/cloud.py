"""`jobplane local up`: moto server + instance runner + trigger loop + control endpoint, in the foreground.

Everything lives under a state directory (default .jobplane/): the state file a second shell and
`jobplane local ...` read, env.sh with the exports, the power-command shims, one scratch root per
instance, and functions.log (what the functions log and their metrics, and the runner's details). The
terminal gets one short line per thing that happens (see jobplane.local.console). Instances live in a VPC
inside 127.0.0.0/8: every address a job sees is on this machine. On exit every instance process, server
and port is gone.

Like a fresh deployment, the registry gets the agent bundle (this machine's variant) and a policy without
images of its own, so jobs boot through the image aliases: the public SSM parameters of Canonical's Ubuntu
name an image that runs on this machine (the local cloud has no Ubuntu), and Debian's name the stock
Debian 12 image when it is built (jobplane.local.rootfs). Instances install requirements.txt from a
package index on loopback (jobplane.local.package_index), never from PyPI.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from pathlib import Path
from types import FrameType
from typing import IO, Any

from jobplane import agent_bundle, bundling, images, keys
from jobplane.local import rootfs
from jobplane.local.console import Console, ConsoleHandler, notified_line
from jobplane.local.control import STATE_FILE, ControlServer
from jobplane.local.moto_server import CONSOLES_ENV

log = logging.getLogger("local-cloud")  # not under "jobplane": the functions' Powertools Logger owns that

FUNCTIONS_LOG = "functions.log"
REGION = "us-east-1"
BUCKET = "jobplane-local"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}
# Short timeouts, so the demo and scenario tests see every rule fire in seconds rather than minutes.
LOCAL_POLICY = """\
# Policy of the local cloud (`jobplane local up`): demo-sized timeouts.
allowed_instance_types: ["*"]
max_nodes_per_job: 4
default_max_runtime: 10m
max_runtime_ceiling: 30m
default_max_wait: 10m
default_stall_timeout: 60s
default_boot_timeout: 60s
max_active_instances_per_owner: 8
aws:
  subnets: [{subnets}]
safety:
  orphan_grace: 20s
  stop_grace: 30s
  max_terminations_per_run: 10
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """moto in its own process: the runner, the functions and the instances share no GIL with it."""

    def __init__(self, port: int = 0) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, log_path: Path, timeout: float = 30, consoles: Path | None = None) -> MotoServer:
        """consoles: where the instance runner keeps each instance's console log (GetConsoleOutput reads it)."""
        env = {**os.environ, **({CONSOLES_ENV: str(consoles)} if consoles else {})}
        with log_path.open("ab") as out:
            command = [sys.executable, "-m", "jobplane.local.moto_server", "-H", "127.0.0.1", "-p", str(self.port)]
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env)
        deadline = time.monotonic() + timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while True:
            try:
                opener.open(f"{self.url}/moto-api/", timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server did not start on port {self.port} (see {log_path})") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class LocalCloud:
    def __init__(self, state_dir: Path, port: int = 0, tick: float = 1.0, bucket: str = BUCKET,
                 schedule: float | None = None) -> None:
        self.state_dir = state_dir.resolve()
        self.tick = tick
        self.schedule = schedule if schedule is not None else max(tick, 2.0)
        self.bucket = bucket
        self.cloud_id = secrets.token_hex(6)
        self.moto = MotoServer(port)
        self.stopping = threading.Event()
        self.runner: Any = None
        self.control: ControlServer | None = None
        self.index: Any = None
        terminal = sys.stdout  # not whatever sys.stdout is when a thread prints: invocations redirect it
        self.console = Console(self._record, write=lambda text: print(text, file=terminal, flush=True))
        self.reg: Any = None
        self.log_stream: IO[str] | None = None
        self.inbox = ""  # the SQS queue subscribed to the notification topic

    @property
    def exports(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.moto.url, "JOBPLANE_BUCKET": self.bucket, "AWS_REGION": REGION,
                "AWS_DEFAULT_REGION": REGION, **CREDENTIALS}

    def start(self) -> LocalCloud:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if (self.state_dir / STATE_FILE).exists():
            raise RuntimeError(f"a local cloud may already be running ({self.state_dir / STATE_FILE} exists); "
                               "stop it, or remove the file if it is stale")
        self.moto.start(self.state_dir / "moto.log", consoles=self.state_dir / "instances")
        try:
            self._provision()
        except BaseException:
            self.stop()
            raise
        return self

    def _provision(self) -> None:
        # This process plays Lambda: the functions read the registry and the cloud from the environment.
        os.environ.update({**self.exports, "JOBPLANE_ROOT": "", "POWERTOOLS_SERVICE_NAME": "jobplane-local",
                           "POWERTOOLS_METRICS_NAMESPACE": "jobplane"})
        os.environ.pop("AWS_EC2_METADATA_DISABLED", None)
        from jobplane.clouds.aws_local import LocalAws
        from jobplane.clouds.s3 import S3Store
        from jobplane.local.package_index import PackageIndex
        from jobplane.local.runner import InstanceRunner, clean
        from jobplane.local.triggers import Functions, TriggerLoop
        from jobplane.registry import Registry

        aws = LocalAws(REGION)
        aws.create_bucket(self.bucket)
        topic, self.inbox = aws.notification_inbox()
        os.environ["JOBPLANE_NOTIFY_TOPIC"] = topic  # the functions publish job notifications there
        reg = self.reg = Registry(S3Store(self.bucket))
        publish_agent(reg)
        policy = LOCAL_POLICY.format(subnets=", ".join(aws.loopback_subnets()))
        reg.store.put(keys.POLICY, policy.encode(), "application/yaml")
        local_images = publish_images(aws)
        clean(self.state_dir)
        self.index = PackageIndex()
        self.index.start()
        self.log_stream = (self.state_dir / FUNCTIONS_LOG).open("a", buffering=1)
        self.functions = Functions(self.log_stream, on_result=self.console.invoked)
        self.triggers = TriggerLoop(reg, self.bucket, REGION, self.functions, self.schedule)
        instance_env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBPLANE_", "POWERTOOLS_"))}
        instance_env.update(UV_INDEX_URL=self.index.url, PIP_INDEX_URL=self.index.url, UV_PYTHON_DOWNLOADS="never")
        self.runner = InstanceRunner(aws, self.state_dir, instance_env, self.cloud_id, self._ec2_event,
                                     local_images)
        self.aws = aws
        self.control = ControlServer({
            "preempt": lambda b: self.runner.preempt(b["job_id"], b.get("rank"), float(b.get("grace", 10))),
            "kill": lambda b: self.runner.kill(b["job_id"], b.get("rank")),
            "instances": lambda b: {"instance_id": aws.run(managed=bool(b.get("managed", True)),
                                                            job_id=b.get("job_id"), attempt=b.get("attempt"),
                                                            user_data=b.get("user_data", ""))},
            "status": lambda b: {"instances": self.runner.status(), "invocations": self.functions.invocations,
                                 "errors": self.functions.errors, "missing": sorted(self.functions.missing)},
        }).start()
        self._write_state()

    def _ec2_event(self, detail: dict[str, Any]) -> None:
        """From the runner: shown on the console, then delivered as EventBridge would."""
        self.console.ec2(detail["detail-type"], detail["detail"])
        self.triggers.ec2_event(detail)

    def _record(self, job_id: str) -> Any:
        from jobplane.registry import JobNotFound

        try:
            return self.reg.job(job_id) if self.reg is not None else None
        except JobNotFound:
            return None

    def _write_state(self) -> None:
        import json

        state = {"pid": os.getpid(), "cloud_id": self.cloud_id, "control_url": self.control.url if self.control
                 else None, "moto_pid": self.moto.proc.pid if self.moto.proc else None, **self.exports}
        (self.state_dir / "env.sh").write_text("".join(f"export {k}={v}\n" for k, v in self.exports.items()))
        tmp = self.state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_dir / STATE_FILE)

    def step(self) -> None:
        """One tick: instances follow moto, then events and schedules fire; notifications reach the console."""
        self.runner.sync()
        self.triggers.tick()
        for data in self.aws.notifications(self.inbox):
            self.console.emit(notified_line(data))

    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                self.step()
            except Exception:
                log.exception("local cloud tick failed; retrying next tick")
            self.stopping.wait(max(0.0, self.tick - (time.monotonic() - started)))

    def stop(self) -> None:
        self.stopping.set()
        if self.control is not None:
            self.control.stop()
        if self.runner is not None:
            self.runner.stop_all()
        if self.index is not None:
            self.index.stop()
        self.moto.stop()
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)
        if self.log_stream is not None:
            self.log_stream.close()


def publish_agent(reg: Any) -> None:
    """This machine's agent bundle and its manifest, where a deployment puts them."""
    path, variant = bundling.local_variant("aws")
    reg.store.put(reg.key(keys.agent_file(variant.name)), path.read_bytes())
    reg.store.put(reg.key(keys.agent_file(agent_bundle.MANIFEST)), agent_bundle.manifest([variant]))


def publish_images(aws: Any) -> dict[str, Path]:
    """Register the local images and publish the vendors' parameters for them; returns AMI -> root fs."""
    arch = bundling.host_architecture()
    ec2_arch = "arm64" if arch == images.AARCH64 else "x86_64"
    host = aws.register_image("jobplane-local", ec2_arch)
    for alias in ("ubuntu-24.04", "ubuntu-24.04-gpu"):  # this machine stands in for Ubuntu
        aws.publish_image_parameter(images.ALIASES[alias].aws[arch], host)
    problem = rootfs.image_problem()
    if problem:
        log.warning("image debian-12 is not available in this local cloud: %s", problem)
        return {}
    debian = aws.register_image("debian-12-local", ec2_arch)
    aws.publish_image_parameter(images.ALIASES["debian-12"].aws[arch], debian)
    return {debian: rootfs.image_dir()}


def up(state_dir: Path, port: int, tick: float) -> None:
    """Run until SIGINT/SIGTERM, then leave nothing behind."""
    state_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        filename=state_dir / FUNCTIONS_LOG)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="No application metrics to publish")
    cloud = LocalCloud(state_dir, port=port, tick=tick)
    logging.getLogger("local-cloud").addHandler(ConsoleHandler(cloud.console))

    def on_signal(signum: int, frame: FrameType | None) -> None:
        cloud.stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    cloud.start()
    print("local cloud up; in another shell:", flush=True)
    for key, value in cloud.exports.items():
        print(f"export {key}={value}", flush=True)
    print(f"(or: source {cloud.state_dir / 'env.sh'})  Ctrl-C stops everything.", flush=True)
    print(f"function logs and metrics: {cloud.state_dir / FUNCTIONS_LOG}", flush=True)
    try:
        cloud.run()
    finally:
        cloud.stop()
        print("local cloud stopped", flush=True)
