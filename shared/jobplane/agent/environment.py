"""The job's environment on the VM, prepared before its phases run: its code and input channels, the config
files and variables SageMaker's layout promises, its container image (pulled) and its requirements.txt
(installed). What runs (the pull, the installs, each phase) is supervised by the core, through `supervise`,
so a notice or a stop request interrupts an install as it does the job."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from jobplane.agent import gpu
from jobplane.agent.clock import SYSTEM, Clock
from jobplane.agent.container import Container, find_runtime
from jobplane.agent.layout import Cluster, Layout, hyperparameters_file, resource_config, shard, user_env
from jobplane.agent.output import OutputLog
from jobplane.agent.process import UserProcess
from jobplane.agent.run import AGENT_ERROR, Outcome, Run
from jobplane.agent.secretenv import dir_path
from jobplane.agent.transfer import Moved, fetch, fetch_tarball, keys_under
from jobplane.clouds.base import NotFound, ObjectStore
from jobplane.model import containers, keys
from jobplane.model.spec import JobSpec
from jobplane.store.rooted import RootedStore

REQUIREMENTS = "requirements.txt"
AGENT_SITE = str(Path(__file__).resolve().parents[2])  # where this agent's packages are (the bundle's site/)


class Environment:
    def __init__(self, reg: RootedStore, layout: Layout, out: OutputLog, *, environ: Mapping[str, str],
                 supervise: Callable[[UserProcess, JobSpec], Outcome],
                 retry: Callable[[str, Callable[[], Moved]], Moved],
                 stores: Callable[[str], ObjectStore] | None = None,
                 registry_login: Callable[[str], tuple[str, str] | None] | None = None, clock: Clock = SYSTEM) -> None:
        self.reg, self.layout, self.out = reg, layout, out
        self.environ = environ  # the agent's own environment (its entry point's), the base of the user's
        self.supervise, self.retry, self.stores = supervise, retry, stores
        self.registry_login = registry_login  # container registry host -> (user, password) with the VM's identity
        self.container: Container | None = None  # where the job's phases run, once its image is pulled
        self.sleep = clock.sleep  # a download retry's pause

    # ---- code, inputs, config -----------------------------------------------------------------------------
    def fetch(self, run: Run, spec: JobSpec, cluster: Cluster) -> None:
        """The job's directories, its code and its input channels (this rank's shard of a sharded one)."""
        lay = self.layout
        for d in (lay.code_dir, lay.config_dir, lay.output_data_dir, lay.local(spec.artifacts_dir),
                  lay.local(spec.checkpoint_dir)):
            d.mkdir(parents=True, exist_ok=True)
        self._fetch_code(run.data or keys.JobData(run.job_id), spec)
        for name, channel in spec.inputs.items():
            bucket, prefix = keys.split_uri(channel.uri)
            store = self._store(bucket)
            found = {info.key: info for info in keys_under(store, prefix)}
            mine = shard(list(found), run.rank, cluster.num_nodes) if channel.distribution == "sharded" else list(found)
            # a retry skips what already arrived (the state file remembers each file's size and version)
            moved = self.retry(f"input {name}", partial(fetch, store, [found[k] for k in mine], prefix,
                                                        lay.channel_dir(name), lay.input_dir / ".jobplane" / name,
                                                        sleep=self.sleep))
            self.out.note(f"input {name}: {len(mine)} of {len(found)} objects: {moved.summary()}")

    def configure(self, run: Run, spec: JobSpec, cluster: Cluster) -> dict[str, str]:
        """resourceconfig.json and hyperparameters.json; returns the variables the job's phases see."""
        lay = self.layout
        lay.resource_config.write_text(json.dumps(resource_config(cluster, run.rank), indent=1))
        lay.hyperparameters.write_text(json.dumps(hyperparameters_file(spec), indent=1))
        # in a container the job sees its own variables only: the image has its own PATH, home and tools
        return user_env(spec=spec, job_id=run.job_id, attempt=run.attempt, rank=run.rank, cluster=cluster,
                        layout=lay, num_gpus=gpu.gpu_count(), num_cpus=os.cpu_count() or 1,
                        base={} if spec.container else _user_base_env(self.environ))

    def _fetch_code(self, data: keys.JobData, spec: JobSpec) -> None:
        if spec.code:
            bucket, key = keys.split_uri(spec.code)
            store = self._store(bucket)
            if key.endswith(keys.TARBALL_SUFFIXES):
                fetch_tarball(store, key, self.layout.code_dir, sleep=self.sleep)
            else:
                fetch(store, keys_under(store, key), key, self.layout.code_dir, sleep=self.sleep)
            self.out.note(f"code from {spec.code}")
            return
        try:
            size = fetch_tarball(*self.reg.location(keys.code_bundle(data)), self.layout.code_dir, sleep=self.sleep)
        except NotFound:
            self.out.note("no code bundle: running in an empty code directory")
            return
        self.out.note(f"code bundle unpacked into {self.layout.code_dir} ({size} bytes)")

    def _store(self, bucket: str) -> ObjectStore:
        if self.stores is None:
            raise RuntimeError(f"no object store for bucket {bucket!r}: the agent was built without `stores`")
        return self.stores(bucket)

    # ---- where the phases run -----------------------------------------------------------------------------
    def phase(self, command: str, env: dict[str, str]) -> UserProcess:
        if self.container is not None:
            return self.container.phase(command, self.layout.code_dir, env, self.out)
        return UserProcess(command, self.layout.code_dir, env, self.out)

    def pull(self, run: Run, spec: JobSpec, auth: tuple[str, str] | None = None) -> Outcome | None:
        """The job's container image, pulled before anything runs in it: with `container.registry_auth`'s user and
        token (auth), else with the VM's identity where the cloud's registry wants one (registry_login), else
        anonymously. The token goes on the login's stdin, never its command line. A failure ends the job naming
        the field."""
        if spec.container is None:
            return None
        image = containers.normalize(spec.container.image)
        runtime = find_runtime(self.environ.get("PATH"))
        if runtime is None:
            return self._agent_error("container.image: this VM's image has no container runtime (podman or docker);"
                                     " use an image with one (the GPU images ship docker) or bake it into yours")
        run.phase = "pulling"
        host = containers.registry_host(image)
        login = auth or (self.registry_login(host) if self.registry_login is not None else None)
        if login is not None:
            done = subprocess.run(containers.login_argv(runtime, host, login[0]), input=login[1].encode(),
                                  capture_output=True, timeout=120, check=False)
            whose = "container.registry_auth" if auth else "this VM's identity"
            self.out.note(f"container: logged in to {host} with {whose} (exit {done.returncode})")
            if done.returncode != 0:
                return self._agent_error(f"container.image: could not log in to {host}: "
                                         f"{done.stderr.decode(errors='replace').strip()[:300]}")
        self.out.note(f"container: pulling {image} with {Path(runtime).name}")
        outcome = self.supervise(UserProcess(containers.pull_argv(runtime, image), self.layout.ml_root,
                                             {"PATH": self.environ.get("PATH", os.defpath)}, self.out), spec)
        if outcome.reason != "exit":
            return outcome  # preempted or stopped meanwhile
        if outcome.code != 0:
            outcome.error = f"container.image: could not pull {image}: {self.out.last_line[:300]} " \
                            f"({Path(runtime).name} pull exited with code {outcome.code})"
            self.out.note(outcome.error)
            return outcome
        lay = self.layout
        self.container = Container(runtime, image, containers.name_for(run.job_id, run.attempt, run.rank),
                                   tuple(spec.container.args),
                                   _outermost([lay.ml_root, lay.local(spec.checkpoint_dir),
                                               lay.local(spec.artifacts_dir),
                                               *[d for d in [dir_path(run.job_id, run.rank)] if d.is_dir()]]),
                                   gpu.gpu_count(),
                                   self.environ.get("PATH", os.defpath))
        return None

    def _agent_error(self, why: str) -> Outcome:
        self.out.note(why)
        return Outcome(AGENT_ERROR, "exit", error=why)

    # ---- requirements.txt ---------------------------------------------------------------------------------
    def requirements(self, run: Run, spec: JobSpec, env: dict[str, str]) -> Outcome | None:
        """As on SageMaker: a requirements.txt in the code is installed before `setup`, with uv, into a job
        environment (seeded with pip, and seeing the image's own packages) that `python3` and `pip` in setup
        and run then mean. Its output goes to the job's log; a failure ends the job naming the file."""
        requirements = self.layout.code_dir / REQUIREMENTS
        if not requirements.is_file():
            return None
        if self.container is not None:
            return self._container_requirements(run, spec, env, requirements)
        venv = self.layout.job_env
        run.phase = "requirements"
        self.out.note(f"{REQUIREMENTS}: installing into {venv}")
        uv = _uv()
        uv_env = {**env, "UV_CACHE_DIR": env.get("UV_CACHE_DIR") or str(self.layout.ml_root / ".cache" / "uv")}
        steps = (("create the job environment", [uv, "venv", "--seed", "--system-site-packages", "--python",
                                                 sys.executable, str(venv)]),
                 ("install it", [uv, "pip", "install", "--python", str(venv / "bin" / "python"), "-r",
                                 str(requirements)]))
        for what, argv in steps:
            outcome = self.supervise(UserProcess(shlex.join(argv), self.layout.code_dir, uv_env, self.out), spec)
            if outcome.reason != "exit":
                return outcome  # preempted or stopped meanwhile
            if outcome.code != 0:
                outcome.error = f"{REQUIREMENTS}: could not {what}: uv exited with code {outcome.code} (see the log)"
                self.out.note(outcome.error)
                return outcome
        env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}")
        self.out.note(f"{REQUIREMENTS}: installed; python3 and pip now mean {venv / 'bin'}")
        return None

    def _container_requirements(self, run: Run, spec: JobSpec, env: dict[str, str], requirements: Path) -> \
            Outcome | None:
        """In a container, the image's own pip installs them into a directory on the VM that every phase
        mounts and finds on PYTHONPATH (each phase is a fresh container)."""
        assert self.container is not None
        site = self.layout.job_env / "container-site"
        run.phase = "requirements"
        self.out.note(f"{REQUIREMENTS}: installing with the image's pip into {site}")
        command = shlex.join(["python3", "-m", "pip", "install", "--no-input", "--target", str(site), "-r",
                              str(requirements)])
        outcome = self.supervise(self.container.phase(command, self.layout.code_dir, env, self.out), spec)
        if outcome.reason == "exit" and outcome.code != 0:
            outcome.error = f"{REQUIREMENTS}: could not install it in the container: pip exited with code " \
                            f"{outcome.code} (see the log)"
            self.out.note(outcome.error)
        if outcome.reason != "exit" or outcome.code != 0:
            return outcome
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
        return None


def _uv() -> str:
    """The uv binary: the one in the agent bundle (or this environment), else whatever is on PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv") or "uv"


def _user_base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment for the user's processes, less the bundle's PYTHONPATH entry: the agent's
    packages (pydantic, boto3...) must not shadow the job's own."""
    env = dict(environ)
    kept = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p and os.path.realpath(p) != AGENT_SITE]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    return env


def _outermost(paths: list[Path]) -> tuple[Path, ...]:
    """The paths not inside another of them: one bind mount each."""
    return tuple(sorted({p for p in paths if not any(p != q and p.is_relative_to(q) for q in paths)}))
