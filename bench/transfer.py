"""Data plane throughput and memory: jobplane's transfers next to the AWS CLI and boto3's defaults.

One run, one machine, same endpoint for every tool: a moto server (S3) and the precondition-enforcing GCS
fake, each in its own process on loopback. Two data sets: one big file (default 6 GiB) and many small ones
(default 10,000 x 64 KiB). For each tool and direction a child process does the transfer and the parent
reads that child's peak RSS from wait4(), so the figure is the transferring process's own.

- jobplane, upload: the agent's checkpoint sync (CheckpointSync.sync(final=True): parallel streaming
  uploads, then the manifest, then the cleanup listing). Download: the big file as restore does it on
  attempt 2 (CheckpointSync.restore), the small files as an input channel (agent.transfer.fetch).
- aws-cli: `aws s3 cp` (--recursive for the small files), AWS CLI v1 installed into a throwaway venv.
- boto3-default: client.upload_file / download_file with the default TransferConfig, one file at a time.
- gcs-default: blob.upload_from_filename / download_to_filename, one file at a time.
- jobplane-crt (S3, the big file): jobplane with boto3's CRT transfer client (awscrt installed beside the run);
  a failure is recorded in the results rather than ending the run.

moto serves a ranged GET by reading the whole object into memory, which makes ranged downloads of a 6 GiB
object (every tool's) impossible; the moto server started here answers ranged GETs of large objects from
moto's own spooled file instead (If-Match honoured), and is otherwise moto, serialized as in the local cloud.

    .venv/bin/python bench/transfer.py                       # 6 GiB + 10,000 x 64 KiB, S3 and GCS
    .venv/bin/python bench/transfer.py --big-mib 512 --files 2000 --clouds s3

Writes bench/results/transfer.json (and prints a markdown table for the README).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

for _var, _val in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
                   "AWS_EC2_METADATA_DISABLED": "true"}.items():
    os.environ.setdefault(_var, _val)

BUCKET = "jobplane-transfer-bench"
MiB = 1 << 20
HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
CLI_VENV = Path(tempfile.gettempdir()) / "jobplane-bench-awscli"
CRT_DIR = Path(tempfile.gettempdir()) / "jobplane-bench-awscrt"


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

    def __init__(self, argv: list[str], ready: str) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
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


# ---- the transfers, each in a child process ------------------------------------------------------------------
def child(role: str, cloud: str, src: Path, dest: Path) -> dict[str, Any]:
    """Run one transfer in this (child) process; returns what it moved and how long it took."""
    tool, direction, data, rep = role.split(":")
    prefix = f"{tool}/{data}/{rep}/"
    started = time.monotonic()
    if tool.startswith("jobplane"):
        from jobplane.agent.checkpoints import CheckpointSync
        from jobplane.agent.transfer import fetch, keys_under

        store = _store(cloud, crt=tool == "jobplane-crt")
        if direction == "up":
            moved = CheckpointSync(store, src, prefix, settle=0).sync(final=True)
        elif data == "big":
            moved = CheckpointSync(store, dest, prefix).restore()
        else:  # what sync(final=True) uploaded, under one folder: read it back as an input channel
            folder = prefix + "files/0/00000001/"
            moved = fetch(store, keys_under(store, folder), folder, dest, dest.parent / f"{dest.name}.state")
        if moved.failed:
            raise SystemExit(f"{len(moved.failed)} transfers failed; see the log above")
        files, size = moved.files, moved.bytes
    elif tool == "boto3-default":
        import boto3

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
        from google.cloud import storage

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
    return {"files": files, "bytes": size, "seconds": time.monotonic() - started, "peak_rss_mb": vm_hwm_mb("self")}


def _store(cloud: str, crt: bool = False) -> Any:
    if cloud == "gcs":
        from jobplane.clouds.gcs import GcsStore

        return GcsStore(BUCKET)
    from jobplane.clouds.s3 import S3Store

    if crt:
        import awscrt  # noqa: F401  (without it boto3 would quietly use the classic client)
    return S3Store(BUCKET, transfer_client="crt" if crt else "classic")


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


# ---- data, tools, rows ---------------------------------------------------------------------------------------
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


def aws_cli() -> Path:
    """The AWS CLI v1 in a throwaway venv (created once, reused by later runs)."""
    aws = CLI_VENV / "bin" / "aws"
    if not aws.exists():
        subprocess.run([sys.executable, "-m", "venv", str(CLI_VENV)], check=True)
        subprocess.run([str(CLI_VENV / "bin" / "pip"), "install", "--quiet", "awscli"], check=True)
    return aws


def crt_path() -> Path | None:
    """awscrt installed into a side directory (it has no dependencies) for a jobplane-crt child, if possible."""
    try:
        import awscrt  # noqa: F401

        return None  # already importable
    except ImportError:
        pass
    if not (CRT_DIR / "awscrt").exists():
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(CRT_DIR), "awscrt"],
                              check=False)
        if done.returncode:
            return None
    return CRT_DIR


def row(cloud: str, tool: str, direction: str, data: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of a measurement's samples; wall time of the whole process for every tool, start-up
    included (the AWS CLI's too); peak RSS is the largest of the samples."""
    mid = sorted(samples, key=lambda x: x["seconds"])[len(samples) // 2]
    seconds = mid["seconds"]
    return {"cloud": cloud, "tool": tool, "direction": direction, "data": data, "files": mid["files"],
            "bytes": mid["bytes"], "seconds": round(seconds, 2), "mb_per_s": round(mid["bytes"] / seconds / 1e6, 1),
            "files_per_s": round(mid["files"] / seconds, 1), "cpu_seconds": round(mid["cpu"], 2),
            "peak_rss_mb": max(x["rss"] for x in samples), "samples_seconds": [round(x["seconds"], 2) for x in samples]}


def wipe(cloud: str, env: dict[str, str], prefix: str) -> None:
    """Delete what a measurement left in the server, so memory does not pile up across samples."""
    if cloud == "s3":
        import boto3

        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            batch = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if batch:
                s3.delete_objects(Bucket=BUCKET, Delete={"Objects": batch, "Quiet": True})
    else:
        from google.cloud import storage

        os.environ["STORAGE_EMULATOR_HOST"] = env["STORAGE_EMULATOR_HOST"]
        client = storage.Client(project="bench")
        for blob in client.list_blobs(BUCKET, prefix=prefix):
            blob.delete()


def sample(cloud: str, tool: str, direction: str, data: str, rep: int, src: Path, dest: Path,
           env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    size = args.files * args.file_kib * 1024 if data == "many" else args.big_mib * MiB
    if tool == "aws-cli":
        remote = f"s3://{BUCKET}/aws-cli/{data}/{rep}/"
        if data == "many":
            ends = (str(src), remote) if direction == "up" else (remote, str(dest))
        else:
            ends = ((str(src / "model.pt"), remote) if direction == "up"
                    else (remote + "model.pt", str(dest / "model.pt")))
        cmd = [str(aws_cli()), "s3", "cp", "--quiet", "--endpoint-url", env["AWS_ENDPOINT_URL"],
               *(["--recursive"] if data == "many" else []), *ends]
        _, seconds, rss, cpu = peak_of(cmd, env)
        moved = {"files": args.files if data == "many" else 1, "bytes": size}
    else:
        child_env = dict(env)
        if tool == "jobplane-crt" and args.crt_path:
            child_env["PYTHONPATH"] += os.pathsep + args.crt_path
        moved, seconds, rss, cpu = peak_of(
            [sys.executable, str(HERE), "--child", f"{tool}:{direction}:{data}:{rep}", "--cloud", cloud,
             "--src", str(src), "--dest", str(dest)], child_env)
    assert moved["files"] == (args.files if data == "many" else 1), moved
    return {"files": moved["files"], "bytes": moved["bytes"], "seconds": seconds, "rss": rss, "cpu": cpu}


def measure_cloud(cloud: str, args: argparse.Namespace, big: Path, many: Path, work: Path,
                  tools: list[str]) -> tuple[list[dict[str, Any]], float]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "shared"))
    if cloud == "s3":
        server = Server([sys.executable, str(HERE), "--moto-server", str(port)], f"http://127.0.0.1:{port}")
        env["AWS_ENDPOINT_URL"] = server.url
        import boto3

        boto3.client("s3", endpoint_url=server.url).create_bucket(Bucket=BUCKET)
    else:
        server = Server([sys.executable, "-m", "jobplane.local.fake_gcs", "--port", str(port), "--bucket", BUCKET],
                        f"http://127.0.0.1:{port}")
        env["STORAGE_EMULATOR_HOST"] = server.url
    rows: list[dict[str, Any]] = []
    try:
        for data, src in (("many", many), ("big", big)):
            samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for rep in range(args.repeat if data == "many" else args.big_repeat):
                # tools take turns, each first in its turn: the machine's load drifts, and a server that has
                # just deleted a tool's objects is slower for the next one
                for tool in tools[rep % len(tools):] + tools[:rep % len(tools)]:
                    for direction in ("up", "down"):
                        dest = work / f"{cloud}-{tool}-{data}-{direction}"
                        if tool in args.failed or (tool == "jobplane-crt" and data == "many"):
                            continue  # (files up to one part go in a single PutObject with either client)
                        if rep and tool.endswith("-default"):
                            continue  # one sample of the slow one-file-at-a-time loops is plenty
                        try:
                            one = sample(cloud, tool, direction, data, rep, src, dest, env, args)
                        except RuntimeError as exc:
                            if tool != "jobplane-crt":
                                raise
                            args.failed[tool] = str(exc)[-400:]  # recorded in the results, not a crash
                            continue
                        samples.setdefault((tool, direction), []).append(one)
                        print(json.dumps({"cloud": cloud, "tool": tool, "direction": direction, "data": data,
                                          **one}), file=sys.stderr, flush=True)
                        if direction == "down":
                            check(src, dest, data)
                            shutil.rmtree(dest, ignore_errors=True)
                            wipe(cloud, env, f"{tool}/{data}/{rep}/")
            rows += [row(cloud, tool, direction, data, got) for (tool, direction), got in samples.items()]
    finally:
        server_rss = server.stop()
    return rows, server_rss


def check(src: Path, dest: Path, data: str) -> None:
    """The download is byte-identical to what was uploaded (sizes of all, bytes of a sample)."""
    want = {p.relative_to(src).as_posix(): p for p in src.rglob("*") if p.is_file()}
    got = {p.relative_to(dest).as_posix(): p for p in dest.rglob("*") if p.is_file()}
    if data == "big":
        got = {Path(k).name: v for k, v in got.items()}
    assert set(got) == set(want), f"{dest}: {sorted(set(want) ^ set(got))[:5]}"
    for rel in list(want)[:20]:
        assert want[rel].stat().st_size == got[rel].stat().st_size, rel
        if data == "many":
            assert want[rel].read_bytes() == got[rel].read_bytes(), rel


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| cloud | data | tool | upload MB/s (files/s) | download MB/s (files/s) | peak RSS up / down (MB) |",
             "|---|---|---|---:|---:|---:|"]
    keyed = {(r["cloud"], r["data"], r["tool"], r["direction"]): r for r in rows}

    def cell(r: dict[str, Any] | None) -> str:
        return f"{r['mb_per_s']} ({r['files_per_s']})" if r else "-"

    for cloud, data, tool in sorted({k[:3] for k in keyed}):
        up, down = keyed.get((cloud, data, tool, "up")), keyed.get((cloud, data, tool, "down"))
        lines.append(f"| {cloud} | {data} | {tool} | {cell(up)} | {cell(down)} | "
                     f"{up['peak_rss_mb'] if up else '-'} / {down['peak_rss_mb'] if down else '-'} |")
    return "\n".join(lines)


def ratios(rows: list[dict[str, Any]], baseline: str) -> dict[str, float]:
    keyed = {(r["cloud"], r["data"], r["tool"], r["direction"]): r["mb_per_s"] for r in rows}
    return {f"{c}:{d}:{dr}": round(v / keyed[(c, d, baseline, dr)], 2)
            for (c, d, t, dr), v in keyed.items() if t == "jobplane" and (c, d, baseline, dr) in keyed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big-mib", type=int, default=6 * 1024)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--file-kib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3,
                        help="samples of jobplane's and the AWS CLI's small-files runs (the median is kept)")
    parser.add_argument("--big-repeat", type=int, default=1,
                        help="samples of jobplane's and the AWS CLI's big-file runs (the median is kept)")
    parser.add_argument("--clouds", nargs="+", default=["s3", "gcs"], choices=["s3", "gcs"])
    parser.add_argument("--no-crt", action="store_true", help="skip the CRT transfer client")
    parser.add_argument("--out", type=Path, default=HERE.parent / "results" / "transfer.json")
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

    work = Path(tempfile.mkdtemp(prefix="jobplane-transfer-bench-"))
    need = (args.big_mib * MiB + args.files * args.file_kib * 1024) * 4  # data, a download, moto's spool
    free = shutil.disk_usage(work).free
    if free < need:
        raise SystemExit(f"{work}: {free / 2**30:.1f} GiB free, this run needs about {need / 2**30:.1f} GiB")
    load_before = os.getloadavg()
    args.crt_path = None if args.no_crt else (str(p) if (p := crt_path()) else None)
    args.failed = {}
    try:
        big, many = make_data(work / "data", args.big_mib, args.files, args.file_kib)
        rows, servers = [], {}
        for cloud in args.clouds:
            tools = (["jobplane", "aws-cli", "boto3-default"] + ([] if args.no_crt else ["jobplane-crt"])
                     if cloud == "s3" else ["jobplane", "gcs-default"])
            cloud_rows, servers[cloud] = measure_cloud(cloud, args, big, many, work, tools)
            rows += cloud_rows
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {"bench": "transfer", "measured_at": datetime.now(UTC).isoformat(),
           "machine": {"cpus": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg()},
           "data": {"big_mib": args.big_mib, "files": args.files, "file_kib": args.file_kib,
                    "small_files_samples": args.repeat, "big_file_samples": args.big_repeat},
           "server_peak_rss_mb": servers, "rows": rows, "failed": args.failed,
           "jobplane_over_aws_cli": ratios(rows, "aws-cli"),
           "jobplane_over_boto3_default": ratios(rows, "boto3-default"),
           "jobplane_over_gcs_default": ratios(rows, "gcs-default")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
