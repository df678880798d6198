"""Cold start of the AWS handlers: their import against bare boto3 + the Powertools pieces they use.

Each sample is a fresh interpreter with the environment the stack gives a Lambda (JOBPLANE_BUCKET,
JOBPLANE_ROOT, POWERTOOLS_*, PYDANTIC_DISABLE_PLUGINS, the region; fake credentials) that times one import with
perf_counter, so interpreter start-up is left out of both sides. The baseline imports what any Powertools
handler imports: boto3, Logger and Metrics, the EventBridge data classes with event_source, and LambdaContext.
The floor is the baseline plus the policy's module, which every run of every control handler reads. Targets run in
rounds, shuffled within each round, so a busy machine slows each side alike; the ratio is of medians.

Moving an import into the handler only moves its cost to the first invocation, so with --invoke (on by
default) each handler sample then runs its first "Scheduled Event" against moto's server in another
process (an idle registry holding a policy.yaml, as a deployed stack's does) and the first invocation,
import + first invocation, and whether that run loaded pydantic (only a run that reads a record needs it) are
reported too.

What this leaves out: samples load cached bytecode (two unrecorded warm-up rounds write it), while the Lambda
asset ships no .pyc, so on Lambda every bundled module a cold start loads (Powertools, yaml, jobplane) is compiled
at each cold start as well. pydantic's plugin scan (every installed distribution's entry points, read at the first
model, of a run that reads a record) is off here as in the stack.

    .venv/bin/python bench/cold_start.py                  # 21 rounds, writes bench/results/cold-start.json
    .venv/bin/python bench/cold_start.py --rounds 41 --no-invoke
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(ROOT), str(ROOT / "shared")]

import report  # noqa: E402

REGION = "us-east-1"
BUCKET = "jobplane-cold-start"
HANDLERS = sorted(p.stem for p in (ROOT / "functions" / "aws").glob("*.py") if "def handler(" in p.read_text())
BASELINE = ("import boto3; "
            "from aws_lambda_powertools import Logger, Metrics; "
            "from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent, event_source; "
            "from aws_lambda_powertools.utilities.typing import LambdaContext")
# What every run of every control handler imports besides: the policy (PyYAML and its plain checks; each run reads it).
# No such handler can import less than this without moving it into the first invocation, so it is timed as the floor.
FLOOR = BASELINE + "; import jobplane.model.policy"
# the stack's config/policy.yaml has this shape: the caps plus where the stack's VMs go (JSON is YAML)
POLICY = json.dumps({"max_nodes_per_job": 8, "aws": {
    "instance_profile": "jobplane-vm", "subnets": ["subnet-0123456789abcdef0"],
    "security_groups": ["sg-0123456789abcdef0"], "placement_group": "jobplane-cluster"}})
MARK = "COLD_START "

SAMPLE = r"""
import json, sys, time
sys.path[:0] = [{root!r}, {shared!r}]
sys.modules["awscrt"] = None  # as in the Lambda runtime, whose botocore finds no awscrt (only the agent carries it)
t0 = time.perf_counter()
{imports}
t1 = time.perf_counter()
out = {{"import_s": t1 - t0}}
if {invoke!r}:
    class Context:
        function_name = "jobplane-cold-start"
        memory_limit_in_mb = 512
        invoked_function_arn = "arn:aws:lambda:{region}:123456789012:function:jobplane-cold-start"
        aws_request_id = "cold-start"
        def get_remaining_time_in_millis(self):
            return 300_000
    event = {{"version": "0", "id": "cold-start", "detail-type": "Scheduled Event", "source": "aws.events",
              "account": "123456789012", "time": "2025-01-01T00:00:00Z", "region": {region!r},
              "resources": [], "detail": {{}}}}
    handler(event, Context())
    out["invoke_s"] = time.perf_counter() - t1
    out["modules"] = len(sys.modules)
    out["pydantic"] = "pydantic" in sys.modules
print({mark!r} + json.dumps(out))
"""


def lambda_env(endpoint: str | None) -> dict[str, str]:
    """What the stack sets on the functions (infra/aws/control_plane.py), the runtime's region, fake keys."""
    env = {"PATH": os.environ.get("PATH", ""), "JOBPLANE_BUCKET": BUCKET, "JOBPLANE_ROOT": "",
           "POWERTOOLS_SERVICE_NAME": "jobplane", "POWERTOOLS_METRICS_NAMESPACE": "jobplane",
           "PYDANTIC_DISABLE_PLUGINS": "__all__", "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
           "AWS_EC2_METADATA_DISABLED": "true"}
    # the vend function's own (its roles and the data buckets): every handler gets them, as none reads another's
    env |= {"JOBPLANE_VM_ROLE_ARN": "arn:aws:iam::123456789012:role/jobplane-vm",
            "JOBPLANE_JOB_ROLE_ARN": "arn:aws:iam::123456789012:role/jobplane-job", "JOBPLANE_DATA_BUCKETS": ""}
    if endpoint:
        env["AWS_ENDPOINT_URL"] = endpoint
    return env


def sample(target: str, env: dict[str, str], invoke: bool) -> dict[str, float]:
    bare = {"baseline": BASELINE, "floor": FLOOR}
    handler = target not in bare
    imports = f"from functions.aws.{target} import handler" if handler else bare[target]
    code = SAMPLE.format(root=str(ROOT), shared=str(ROOT / "shared"), imports=imports, invoke=invoke and handler,
                         region=REGION, mark=MARK)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{target}: {proc.stderr.strip()[-2000:]}")
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    result: dict[str, float] = json.loads(line.removeprefix(MARK))
    return result


def idle_registry() -> Any:
    """moto's server in its own process, with the bucket and its policy.yaml (the local cloud's patches)."""
    import boto3

    from jobplane.local.cloud import ServiceProcess

    server = ServiceProcess("jobplane.local.moto_server")
    report.RESULTS.mkdir(exist_ok=True)
    server.start(report.RESULTS / "cold-start-moto.log")
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=server.url, aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="config/policy.yaml", Body=POLICY.encode())
    return server


def ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21, help="samples per target (each a fresh interpreter)")
    parser.add_argument("--invoke", action=argparse.BooleanOptionalAction, default=True,
                        help="also time each handler's first scheduled invocation against moto's server")
    parser.add_argument("--handlers", nargs="*", default=HANDLERS, help=f"default: {' '.join(HANDLERS)}")
    parser.add_argument("--warmup", type=int, default=2, help="unrecorded rounds first (they write the bytecode)")
    args = parser.parse_args(argv)

    server = idle_registry() if args.invoke else None
    env = lambda_env(server.url if server else None)
    targets = ["baseline", "floor", *args.handlers]
    samples: dict[str, list[dict[str, float]]] = {t: [] for t in targets}
    load_before = os.getloadavg()
    try:
        for _ in range(args.warmup):  # warm the bytecode and page caches; not counted
            for target in targets:
                sample(target, env, invoke=False)
        for _ in range(args.rounds):
            order = random.sample(targets, len(targets))
            for target in order:
                samples[target].append(sample(target, env, args.invoke))
    finally:
        if server is not None:
            server.stop()

    base = ms([s["import_s"] for s in samples["baseline"]])
    floor = ms([s["import_s"] for s in samples["floor"]])
    handlers: dict[str, Any] = {}
    for name in args.handlers:
        got = samples[name]
        row: dict[str, Any] = {"import_ms": ms([s["import_s"] for s in got]),
                               "ratio": round(ms([s["import_s"] for s in got]) / base, 2)}
        if args.invoke:
            row |= {"first_invocation_ms": ms([s["invoke_s"] for s in got]),
                    "import_plus_first_invocation_ms": ms([s["import_s"] + s["invoke_s"] for s in got]),
                    "modules_after_first_invocation": round(statistics.median(s["modules"] for s in got)),
                    "pydantic_after_first_invocation": any(s["pydantic"] for s in got)}
        handlers[name] = row
    result = {
        "python": sys.version.split()[0],
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "baseline": {"imports": BASELINE, "import_ms": base},
        "floor": {"imports": FLOOR, "import_ms": floor, "ratio": round(floor / base, 2)},
        "handlers": handlers,
        "max_ratio": max(row["ratio"] for row in handlers.values()),
    }
    return report.save("cold-start", result)


if __name__ == "__main__":
    raise SystemExit(main())
