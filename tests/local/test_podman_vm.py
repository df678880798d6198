"""Containers in a local VM: an instance of the Debian 12 + podman image pulls jobplane/debian:12 from the local
cloud's registry on loopback and runs it with podman, crun and catatonit, inside the sandbox every local VM runs
in (jobplane.local.rootfs.sandbox: its own mount and PID namespaces, this machine's network). What makes podman
work there (the drop-ins, sysfs, the empty /sys/fs/cgroup, storage on this machine's filesystem) is what is
under test; a registry that does not know an image makes podman fail with its usual exit code, and a container
network, which would be made on this machine (the VM's network is this machine's), is refused. A job in a
container through each local cloud: tests/local/test_container_job.py."""

from __future__ import annotations

import contextlib
import os
import resource
import secrets
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobplane.local import oci_registry, rootfs
from jobplane.local.oci_registry import LocalRegistry
from jobplane.local.runner import MARKER, SHIM, kill_marked

pytestmark = pytest.mark.timeout(300)

# The VM's user-data: every result lands in the directory it shares with this test.
USER_DATA = """\
out={share}
ref={ref}
now() {{ date +%s.%N; }}
t0=$(now)
podman pull -q "$ref" > $out/pull.out 2>&1; echo $? > $out/pull.rc
t1=$(now)
podman run --rm --init --network host --pull=never "$ref" cat /etc/os-release > $out/os-release 2> $out/run.err
echo $? > $out/run.rc
t2=$(now)
podman run --rm --init --network host --pull=never "$ref" sh -c 'ulimit -Hn; cat /proc/1/comm' > $out/inside 2>&1
podman pull -q {nope} > $out/nope.out 2>&1; echo $? > $out/nope.rc
cut -d: -f1 /proc/net/dev | tail -n +3 > $out/vm-links
podman run --rm --pull=never "$ref" sh -c 'cut -d: -f1 /proc/net/dev | tail -n +3' > $out/default-links 2>&1
podman run --rm --pull=never --network bridge "$ref" true > $out/bridge.out 2>&1; echo $? > $out/bridge.rc
echo "$t0 $t1 $t2" > $out/times
"""

Boot = Callable[[str], tuple[Path, int, str]]


def images_built() -> None:
    if problem := rootfs.podman_image_problem() or oci_registry.image_problem():
        pytest.skip(problem)  # `make local-images` builds both


@pytest.fixture
def registry() -> Iterator[LocalRegistry]:
    images_built()
    with LocalRegistry() as served:
        yield served


@pytest.fixture
def boot(tmp_path: Path) -> Iterator[Boot]:
    """Runs a user-data script in a VM of the podman image to its end; everything the VM started is killed after."""
    vm_id = f"podman-test-{secrets.token_hex(4)}"
    started: list[subprocess.Popen[str]] = []

    def run(script: str) -> tuple[Path, int, str]:
        instance = tmp_path / f"vm{len(started)}"
        (instance / "share").mkdir(parents=True)
        (instance / "share" / "user-data").write_text(script)
        env = {"PATH": rootfs.PATH, "HOME": "/root", MARKER: vm_id,
               "JOBPLANE_LOCAL_POWER_LOG": f"{rootfs.SHARE}/power.log"}
        shims = {name: SHIM.format(name=name) for name in rootfs.POWER_COMMANDS}
        command = rootfs.sandbox(rootfs.podman_image_dir(), instance, env, shims)
        proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        started.append(proc)
        console, _ = proc.communicate(timeout=240)
        return instance, proc.returncode, console

    try:
        yield run
    finally:
        kill_marked(f"{MARKER}={vm_id}", grace=1.0)
        for n, proc in enumerate(started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            shutil.rmtree(tmp_path / f"vm{n}" / "containers", ignore_errors=True)  # 100+ MB pytest would keep


def test_a_vm_of_the_podman_image_pulls_from_the_local_registry_and_runs_the_container(
        registry: LocalRegistry, boot: Boot) -> None:
    ref = registry.reference()
    nope = f"{registry.address}/jobplane/nope:1"
    links = sorted(os.listdir("/sys/class/net"))
    instance, code, console = boot(USER_DATA.format(share=rootfs.SHARE, ref=ref, nope=nope))
    share = instance / "share"

    def read(name: str) -> str:
        return (share / name).read_text().strip() if (share / name).exists() else f"({name} missing)"

    context = f"exit {code}, console:\n{console}\npull: {read('pull.out')}\nrun: {read('run.err')}"
    assert code == 0, context
    assert read("pull.rc") == "0", context
    assert read("run.rc") == "0", context
    assert 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"' in read("os-release"), context
    hard_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert read("inside").split() == [str(hard_nofile), "podman-init"], context  # the VM's limit; catatonit
    assert (instance / "containers" / "storage" / "overlay").is_dir(), "podman's storage: the instance's own"
    assert read("nope.rc") == "125", read("nope.out")
    assert "name unknown" in read("nope.out")  # NAME_UNKNOWN: no such repository here
    assert read("default-links").split() == read("vm-links").split(), "a container's network is the VM's by default"
    assert read("bridge.rc") == "126" and 'failed to find plugin "bridge"' in read("bridge.out"), read("bridge.out")
    assert sorted(os.listdir("/sys/class/net")) == links, "no bridge or veth on this machine"
    started, pulled, ran = (float(t) for t in read("times").split())
    print(f"podman in a local VM: pull {pulled - started:.2f} s, run {ran - pulled:.2f} s")

