"""The local cloud's stock Debian 12 image, and the sandbox its instances run in.

The image is a root filesystem built from Debian's packages (debootstrap --variant=minbase plus python3,
nothing else: no pip, no venv module, no jobplane, no cloud CLI, the PEP 668 EXTERNALLY-MANAGED marker
kept), built once into the cache outside the repo and renamed into place whole. An instance of it runs
its user-data with that tree as / in its own mount and PID namespaces (unshare), over a per-instance
copy-on-write overlay, so nothing ever writes into the image. It keeps the host's network namespace, so
loopback reaches the moto server, its IMDS and the package index, and nothing else is configured. /proc is
its own, /dev holds null, zero, full, random, urandom and tty only, and the power shims are the only
shutdown, poweroff, halt and reboot on its PATH.

A second image, Debian 12 + podman, is the stock one with Debian's podman, crun and catatonit added (apt-get in
a chroot of a copy) and two drop-ins that let podman run in the sandbox (see PODMAN_CONF). An instance of
it also gets what podman needs of a machine: sysfs (read-only), an empty /sys/fs/cgroup (there is no cgroup
here for it to manage) and its own /var/lib/containers on this machine's filesystem (overlayfs refuses an
overlay whose upper directory is on another overlay).

    python -m jobplane.local.rootfs build    # the install step (make): never fails, says why if it cannot
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from jobplane.boot.bundling import atomic_build
from jobplane.local import cache_dir, install_step

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PYTHON = "3.11"  # bookworm's python3
SHARE = "/run/jobplane-local"  # inside an instance: its user-data and power log, shared with the runner
POWER_COMMANDS = ("shutdown", "poweroff", "halt", "reboot")
BIN_DIRS = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin")
PATH = ":".join("/" + d for d in BIN_DIRS)
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
# conmon comes with podman. Named because apt would not pick them: a provider of the virtual container-network-stack
# (containers-common needs one) and catatonit (`podman run --init`, only recommended).
PODMAN_PACKAGES = ("podman", "crun", "catatonit", "containernetworking-plugins")
PODMAN_CONF = {
    # No cgroup is the sandbox's to manage. With no default ulimits, a container keeps the VM's own limits:
    # podman's defaults (nofile 1048576) exceed the hard limit, and root here lacks CAP_SYS_RESOURCE. The VM's
    # network namespace is this machine's, so a container network (a bridge, routes, ip_forward) would be made on
    # this machine: containers get the host's network by default, and no CNI plugin for any other.
    "etc/containers/containers.conf.d/50-jobplane-local.conf": """\
[containers]
cgroups = "disabled"
default_ulimits = []
netns = "host"
[engine]
cgroup_manager = "cgroupfs"
runtime = "crun"
[network]
cni_plugin_dirs = ["/usr/lib/cni/none"]
""",
    # The local cloud's registry (jobplane.local.oci_registry) speaks plain HTTP on 127.0.0.1, on whatever port
    # it got. A location without a port matches any port in containers/image 5.23 (Debian 12's), a match its
    # authors call unintended: tests/local/test_podman_vm.py would see it go.
    "etc/containers/registries.conf.d/50-jobplane-local.conf": """\
[[registry]]
location = "127.0.0.1"
insecure = true
""",
}


def image_dir() -> Path:
    return cache_dir() / "rootfs" / "debian-12"


def image_problem(root: Path | None = None) -> str | None:
    """Why the image cannot be used here, or None."""
    root = root or image_dir()
    if not (root / "usr" / "bin" / "python3").exists():
        return f"no Debian 12 root filesystem at {root}: build it with `python -m jobplane.local.rootfs build` (make)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--mount", "--pid", "--fork", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create mount and PID namespaces here (needs root): {probe.stderr.strip()}"
    return None


def build(root: Path | None = None) -> Path:
    """debootstrap the image (a few minutes, from Debian's mirror); a no-op once it exists."""
    root = root or image_dir()
    if shutil.which("debootstrap") is None and shutil.which("apt-get") is not None:
        subprocess.run(["apt-get", "update", "-qq"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-qq", "debootstrap"], check=True, stdout=subprocess.DEVNULL)
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (apt-get install debootstrap)")

    def bootstrap(tmp: Path) -> None:
        tmp.chmod(0o755)  # it becomes the image's /
        subprocess.run(["debootstrap", "--variant=minbase", "--include=python3", SUITE, str(tmp), MIRROR],
                       check=True, stdout=subprocess.DEVNULL)
        shutil.rmtree(tmp / "var" / "cache" / "apt" / "archives", ignore_errors=True)

    return atomic_build(root, bootstrap)


def podman_image_dir() -> Path:
    return cache_dir() / "rootfs" / "debian-12-podman"


def podman_image_problem(root: Path | None = None) -> str | None:
    """Why the Debian 12 + podman image cannot be used here, or None."""
    root = root or podman_image_dir()
    if not (root / "usr" / "bin" / "podman").exists():
        return (f"no Debian 12 + podman root filesystem at {root}: build it with "
                "`python -m jobplane.local.rootfs build` (make local-images)")
    return image_problem(root)


def build_podman(root: Path | None = None) -> Path:
    """Copy the stock image and apt-get install podman into the copy (seconds, from Debian's mirror), with the
    drop-ins; apt's package lists and downloads are left out. A no-op once it exists."""
    root = root or podman_image_dir()
    stock = build()

    def install(tmp: Path) -> None:
        tmp.chmod(0o755)
        subprocess.run(["cp", "-a", "--reflink=auto", f"{stock}/.", str(tmp)], check=True)
        q = shlex.quote
        apt = "apt-get -qq -o Dpkg::Use-Pty=0"
        setup = "\n".join([
            "set -e", *_system_mounts(tmp),
            f"mount --bind /etc/resolv.conf {q(str(tmp / 'etc' / 'resolv.conf'))}",  # this machine's DNS
            f"exec chroot {q(str(tmp))} /usr/bin/env -i PATH={PATH} DEBIAN_FRONTEND=noninteractive sh -c "
            + q(f"{apt} update && {apt} install -y --no-install-recommends {' '.join(PODMAN_PACKAGES)}"),
        ])
        done = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "sh", "-c", setup],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:  # its stderr says why (and otherwise only that debconf has no apt-utils)
            raise RuntimeError(f"apt-get install {' '.join(PODMAN_PACKAGES)} failed: {done.stderr.strip()[-800:]}")
        for cache in ("var/lib/apt/lists", "var/cache/apt"):
            shutil.rmtree(tmp / cache)
            (tmp / cache).mkdir()
        for name, text in PODMAN_CONF.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)
        (tmp / "usr" / "lib" / "cni" / "none").mkdir()  # cni_plugin_dirs must exist

    return atomic_build(root, install)


def _system_mounts(merged: Path) -> list[str]:
    """Shell lines that give the tree at merged its own /proc and a minimal /dev (in a private mount namespace)."""
    q = shlex.quote
    return [
        f"mount -t proc proc {q(str(merged / 'proc'))}",
        f"mount -t tmpfs -o mode=755,size=1m tmpfs {q(str(merged / 'dev'))}",
        *(f"touch {q(str(merged / 'dev' / d))} && mount --bind /dev/{d} {q(str(merged / 'dev' / d))}"
          for d in DEVICES),
        f"mkdir -p {q(str(merged / 'dev' / 'shm'))} && mount -t tmpfs tmpfs {q(str(merged / 'dev' / 'shm'))}",
        f"ln -s /proc/self/fd {q(str(merged / 'dev' / 'fd'))}",
        *(f"ln -s /proc/self/fd/{n} {q(str(merged / 'dev' / s))}" for n, s in enumerate(("stdin", "stdout", "stderr"))),
    ]


def sandbox(rootfs: Path, instance: Path, env: dict[str, str], shims: dict[str, str]) -> list[str]:
    """The command that runs <instance>/share/user-data inside the image: the instance's own overlay
    (<instance>/upper, /work, /root), /proc, minimal /dev, shims in /usr/sbin, then chroot with only `env`.
    An image with podman also gets sysfs, an empty /sys/fs/cgroup and <instance>/containers as its storage."""
    podman = (rootfs / "usr" / "bin" / "podman").exists()
    for sub in ("upper/usr/sbin", "work", "root", "share", *(["containers"] if podman else [])):
        (instance / sub).mkdir(parents=True, exist_ok=True)
    for name in POWER_COMMANDS:  # in the overlay's upper layer: they shadow whatever the image has there
        shim = instance / "upper" / "usr" / "sbin" / name
        shim.write_text(shims[name])
        shim.chmod(0o755)
    merged = instance / "root"
    hide = [(f"{merged}/{d}/{name}", name) for d in BIN_DIRS if d != "usr/sbin" for name in POWER_COMMANDS
            if (rootfs / d / name).exists() and not (rootfs / d).is_symlink()]
    q = shlex.quote
    setup = "\n".join([
        "set -e",
        f"mount -t overlay overlay -o lowerdir={q(str(rootfs))},upperdir={q(str(instance / 'upper'))},"
        f"workdir={q(str(instance / 'work'))} {q(str(merged))}",
        *_system_mounts(merged),
        *([f"mount -t sysfs -o ro,nosuid,nodev,noexec sysfs {q(str(merged / 'sys'))}",
           f"mount -t tmpfs -o mode=755,size=64k tmpfs {q(str(merged / 'sys' / 'fs' / 'cgroup'))}",
           f"mkdir -p {q(str(merged / 'var' / 'lib' / 'containers'))} && mount --bind "
           f"{q(str(instance / 'containers'))} {q(str(merged / 'var' / 'lib' / 'containers'))}"] if podman else []),
        *(f"mount --bind {q(str(instance / 'upper' / 'usr' / 'sbin' / name))} {q(path)}" for path, name in hide),
        f"mkdir -p {q(str(merged) + SHARE)} && mount --bind {q(str(instance / 'share'))} {q(str(merged) + SHARE)}",
        f"exec chroot {q(str(merged))} /usr/bin/env -i "
        + " ".join(q(f"{k}={v}") for k, v in sorted(env.items())) + f" /bin/bash {SHARE}/user-data",
    ])
    return ["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "sh", "-c", setup]


def enter(sandbox_pid: int, env: dict[str, str], argv: list[str]) -> list[str] | None:
    """The command that runs argv in a running instance of the image, as a process of that VM (its namespaces,
    its root, only `env`); None once its first process is gone. sandbox_pid: what sandbox() ran."""
    try:
        first = Path(f"/proc/{sandbox_pid}/task/{sandbox_pid}/children").read_text().split()
    except OSError:
        return None
    if not first:
        return None
    return ["nsenter", "--target", first[0], "--mount", "--pid", "--root", "--wd", "/usr/bin/env", "-i",
            *(f"{k}={v}" for k, v in sorted(env.items())), *argv]


def main(argv: list[str] | None = None) -> int:
    def built() -> str:
        root = build()
        problem = image_problem(root)
        done = f"Debian 12 image at {root}" + (f", but unusable here: {problem}" if problem else "")
        try:
            podman = build_podman()
        except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
            return f"{done}\nthe Debian 12 + podman image is not available (its tests will skip): {exc}"
        problem = podman_image_problem(podman)
        return f"{done}\nDebian 12 + podman image at {podman}" + (f", but unusable here: {problem}" if problem else "")

    return install_step(argv, "jobplane.local.rootfs build", built,
                        "the local cloud's Debian 12 images are not available (their scenario tests will skip)")


if __name__ == "__main__":
    sys.exit(main())
