"""The real agent as a subprocess against moto S3 and a fake IMDS: every way a node's run can end."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from datetime import UTC, datetime

import boto3
import pytest

from jobplane.model import keys, metrics
from jobplane.model.records import ExitReport, Heartbeat, PreemptedMarker, StopRequest
from tests.agent.conftest import ROOT, World, console_of, json_line
from tests.helpers import data_of, wait_for

pytestmark = pytest.mark.timeout(60)

TRAIN = """\
import json, os, pathlib
ckpt = pathlib.Path(os.environ["JOBPLANE_CHECKPOINT_DIR"])
start = int((ckpt / "latest.txt").read_text()) if (ckpt / "latest.txt").exists() else 0
print("resuming from step", start)
data = pathlib.Path(os.environ["SM_CHANNEL_TRAIN"], "part-0.csv").read_text()
for step in range(start + 1, start + 4):
    print(f"step {step} loss {1.0 / step:.3f} rows {len(data.splitlines())}")
    (ckpt / f"ckpt-{step}.txt").write_text(str(step))
    (ckpt / "latest.txt").write_text(str(step))
pathlib.Path(os.environ["SM_MODEL_DIR"], "model.json").write_text(json.dumps({"w": 0.5}))
print("ENV " + json.dumps({k: os.environ[k] for k in ("JOBPLANE_JOB_ID", "JOBPLANE_ATTEMPT", "LR")}))
"""


def test_success_uploads_logs_checkpoints_artifacts_and_exit_report(world: World) -> None:
    boto3.client("s3").put_object(Bucket="jobplane-agent-test", Key="data/train/part-0.csv", Body=b"a,1\nb,2\n")
    world.seed("ok-job", {"setup": "echo setting up && touch setup-ran", "run": "python3 train.py",
                          "env": {"LR": 0.1},
                          "inputs": {"train": {"uri": "s3://jobplane-agent-test/data/train"}}},
               code={"train.py": TRAIN})
    # a checkpoint from an earlier attempt: the agent restores it, so the run resumes
    world.save_checkpoint("ok-job", {"latest.txt": b"10"})
    node = world.start("ok-job")
    assert node.wait() == 0, console_of(node)

    report = ExitReport.parse(world.reg.get_bytes(keys.exit_report("ok-job", 1, 0)))
    assert (report.code, report.reason, report.instance_id) == (0, "exit", node.imds.instance.instance_id)
    assert report.started_at is not None and report.ended_at is not None and report.started_at <= report.ended_at
    logs = world.logs("ok-job")
    assert "setting up" in logs and "resuming from step 10" in logs
    assert "step 13 loss 0.077 rows 2" in logs
    assert json_line(logs, "ENV ") == {"JOBPLANE_JOB_ID": "ok-job", "JOBPLANE_ATTEMPT": "1", "LR": "0.1"}
    assert "step 13 loss" in console_of(node)  # streamed to the agent's console too
    first_chunk = next(world.reg.listing(keys.logs_prefix(data_of(world.reg, "ok-job"), 1, 0)))[0]
    tagging = boto3.client("s3").get_object_tagging(Bucket="jobplane-agent-test", Key=world.reg.key(first_chunk))
    assert tagging["TagSet"] == [{"Key": "jobplane:object", "Value": "log"}]  # for the lifecycle rule
    assert (node.ml_root / "code" / "setup-ran").exists()  # setup ran in the unpacked code dir
    ckpts = world.checkpoint("ok-job")
    assert ckpts == {"latest.txt": b"13", "ckpt-11.txt": b"11", "ckpt-12.txt": b"12", "ckpt-13.txt": b"13"}
    artifacts = world.files(keys.artifacts_prefix(data_of(world.reg, "ok-job")))
    assert json.loads(artifacts["model/model.json"]) == {"w": 0.5}
    manifest = json.loads(artifacts["model.manifest.json"])  # written after the files it names
    assert manifest["files"]["model.json"]["size"] == len(artifacts["model/model.json"])
    beat = Heartbeat.parse(world.reg.get_bytes(keys.heartbeat("ok-job", 1, 0)))
    assert beat.rank == 0 and beat.gpu_util is None and beat.last_output_at  # no GPU here
    assert world.exists(keys.output_mark("ok-job", 1, 0))
    assert not world.exists(keys.preempted_marker("ok-job"))
    assert world.poweroff_log.read_text().strip() == "-h now"
    assert not (node.ml_root.parent / "opt").exists()


@pytest.mark.parametrize(("setup", "run", "code"), [(None, "echo failing; exit 3", 3),
                                                    ("echo broken setup; exit 4", "echo never ran", 4)])
def test_failing_user_code_is_reported_with_its_exit_code(world: World, setup: str | None, run: str,
                                                          code: int) -> None:
    world.seed("bad-job", {"setup": setup, "run": run})
    node = world.start("bad-job")
    assert node.wait() == 0, console_of(node)
    report = world.json(keys.exit_report("bad-job", 1, 0))
    assert (report["code"], report["reason"]) == (code, "exit")
    logs = world.logs("bad-job")
    assert ("failing" if setup is None else "broken setup") in logs
    assert "never ran" not in logs
    assert world.poweroff_log.exists()


LOOP = """
trap 'echo got SIGTERM; echo final > "$JOBPLANE_CHECKPOINT_DIR/final.txt"; exit 0' TERM
echo $$ > "$JOBPLANE_CHECKPOINT_DIR/../pid"
echo started > "$JOBPLANE_CHECKPOINT_DIR/started.txt"
i=0
while true; do i=$((i+1)); echo "step $i"; echo $i > "$JOBPLANE_CHECKPOINT_DIR/step.txt"; sleep 0.1; done
"""


def test_spot_notice_checkpoints_marks_preempted_and_powers_off(world: World) -> None:
    world.seed("spot-job", {"run": LOOP, "spot": True, "stop_grace": 30})
    node = world.start("spot-job")
    wait_for("periodic checkpoint upload", lambda: "started.txt" in world.checkpoint("spot-job"))
    served = node.imds.set_notice("terminate")
    assert node.wait() == 0, console_of(node)

    ckpts = world.checkpoint("spot-job")
    assert ckpts["final.txt"] == b"final\n"  # written in the SIGTERM handler, uploaded before the exit
    assert ckpts["started.txt"] == b"started\n" and int(ckpts["step.txt"]) > 0
    marker = PreemptedMarker.parse(world.reg.get_bytes(keys.preempted_marker("spot-job")))
    assert marker == PreemptedMarker(attempt=1, rank=0, notice=served, instance_id=node.imds.instance.instance_id)
    report = world.json(keys.exit_report("spot-job", 1, 0))
    assert (report["reason"], report["code"], report["notice"]) == ("preempted", 0, served)
    logs = world.logs("spot-job")
    assert "got SIGTERM" in logs and "preempted" in logs
    assert world.poweroff_log.exists()


def test_stop_request_kills_a_process_that_ignores_sigterm(world: World) -> None:
    world.seed("stop-job", {"run": "trap '' TERM\n" + LOOP.split("\n", 2)[2]})
    node = world.start("stop-job", extra=["--stop-grace", "1"])
    pid_file = node.ml_root / "pid"
    wait_for("the user process", lambda: world.exists(keys.output_mark("stop-job", 1, 0)) and pid_file.exists())
    world.reg.put_json(keys.stop_request("stop-job"), StopRequest(time=datetime.now(UTC), by="cli").body())
    asked = time.monotonic()
    assert node.wait() == 0, console_of(node)
    assert time.monotonic() - asked < 10  # poll 0.3 s + grace 1 s + final sync, not the spec's 60 s
    report = world.json(keys.exit_report("stop-job", 1, 0))
    assert (report["reason"], report["code"]) == ("stopped", 137)  # SIGKILL after the grace
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
    assert not world.exists(keys.preempted_marker("stop-job"))
    assert world.poweroff_log.exists()



def test_sigterm_to_the_agent_stops_the_job_gracefully_and_reports(world: World) -> None:
    """EC2's OS shutdown (a terminate, or a Spot interruption at its deadline) sends the agent SIGTERM."""
    world.seed("term-job", {"run": LOOP, "stop_grace": 60})
    node = world.start("term-job", extra=["--checkpoint-interval", "60"])  # no periodic upload in this test
    # the loop's first step, not just its pid: a SIGTERM before it would leave no step.txt to upload
    wait_for("the user process's first step", lambda: any(node.ml_root.rglob("step.txt")))
    node.proc.send_signal(signal.SIGTERM)
    assert node.wait() == 0, console_of(node)

    report = world.json(keys.exit_report("term-job", 1, 0))
    assert (report["reason"], report["code"]) == ("stopped", 0)  # no Spot notice in IMDS; LOOP exits 0 on TERM
    assert "notice" not in report and not world.exists(keys.preempted_marker("term-job"))
    ckpts = world.checkpoint("term-job")
    logs = world.logs("term-job")
    assert ckpts["final.txt"] == b"final\n"  # the final sync's uploads: step.txt too, unless the freeze caught
    assert "step.txt" in ckpts or "checkpoint step.txt left out: open for writing" in logs  # it mid-write
    grace = re.search(r"stopped \(SIGTERM received\): SIGTERM to the process group, (\d+) s grace", logs)
    assert grace and 5 <= int(grace[1]) <= 13, logs  # the spec's 60 s, capped to fit the shutdown budget
    assert "got SIGTERM" in logs and "SIGTERM: stopped" in logs
    assert world.poweroff_log.exists()

REPORT = """
import json, os, pathlib
seen = {k: os.environ[k] for k in ("NODE_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT", "SM_CURRENT_HOST",
                                   "SM_HOSTS", "SM_NUM_GPUS")}
seen["resourceconfig"] = json.loads(pathlib.Path(os.environ["SM_INPUT_CONFIG_DIR"], "resourceconfig.json").read_text())
seen["shards"] = sorted(os.listdir(os.environ["SM_CHANNEL_SHARDS"]))
seen["vocab"] = sorted(os.listdir(os.environ["SM_CHANNEL_VOCAB"]))
pathlib.Path(os.environ["SM_MODEL_DIR"], "seen.json").write_text(json.dumps(seen))
"""


def test_two_nodes_each_see_their_rank_cluster_and_shard(world: World) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="jobplane-agent-data")
    for i in range(4):
        s3.put_object(Bucket="jobplane-agent-data", Key=f"shards/part-{i}", Body=b"x")
    s3.put_object(Bucket="jobplane-agent-data", Key="vocab.txt", Body=b"a b c")
    s3.put_object(Bucket="jobplane-agent-data", Key="vocab.txt.bak", Body=b"not me")
    hosts = ("10.0.0.11", "10.0.0.12")
    world.seed("two-node", {"num_nodes": 2, "run": "python3 report.py", "inputs": {
        "shards": {"uri": "s3://jobplane-agent-data/shards/", "distribution": "sharded"},
        "vocab": {"uri": "s3://jobplane-agent-data/vocab.txt"}}}, code={"report.py": REPORT}, hosts=hosts)
    nodes = [world.start("two-node", rank) for rank in (0, 1)]
    for node in nodes:
        assert node.wait() == 0, console_of(node)

    artifacts = world.files(keys.artifacts_prefix(data_of(world.reg, "two-node")))
    for rank, key in ((0, "model/seen.json"), (1, "rank-1/model/seen.json")):
        seen = json.loads(artifacts[key])
        assert (seen["NODE_RANK"], seen["NNODES"], seen["MASTER_ADDR"], seen["MASTER_PORT"]) == (
            str(rank), "2", "10.0.0.11", "29500")
        assert seen["SM_CURRENT_HOST"] == hosts[rank] and json.loads(seen["SM_HOSTS"]) == list(hosts)
        assert seen["SM_NUM_GPUS"] == "0"
        rc = seen["resourceconfig"]
        assert rc["current_host"] == hosts[rank] and rc["hosts"] == list(hosts)
        assert rc["instance_groups"][0]["hosts"] == list(hosts)
        assert seen["shards"] == [f"part-{i}" for i in (rank, rank + 2)]  # round-robin over sorted keys
        assert seen["vocab"] == ["vocab.txt"]  # the object itself, not vocab.txt.bak
        report = world.json(keys.exit_report("two-node", 1, rank))
        assert (report["code"], report["reason"]) == (0, "exit")
    assert world.poweroff_log.read_text().count("-h now") == 2


def test_agent_configured_by_environment_like_the_bootstrap_starts_it(world: World) -> None:
    world.seed("env-job", {"run": 'echo "hello from $JOBPLANE_JOB_ID attempt $JOBPLANE_ATTEMPT"'})
    node = world.start("env-job", env_only={
        "JOBPLANE_CLOUD": "aws", "JOBPLANE_BUCKET": "jobplane-agent-test", "JOBPLANE_ROOT": ROOT,
        "JOBPLANE_REGION": "", "JOBPLANE_JOB_ID": "env-job", "JOBPLANE_ATTEMPT": "1",
        "JOBPLANE_AGENT_LOG_INTERVAL": "0.3", "JOBPLANE_AGENT_POLL_INTERVAL": "0.3"})
    assert node.wait() == 0, console_of(node)
    assert "hello from env-job attempt 1" in world.logs("env-job")
    assert world.json(keys.exit_report("env-job", 1, 0))["code"] == 0
    assert world.poweroff_log.exists()


DIVERGE = """
import json, os, pathlib, signal, sys, time
hps = json.loads(pathlib.Path(os.environ["SM_INPUT_CONFIG_DIR"], "hyperparameters.json").read_text())
print("hyperparameters " + json.dumps({"file": hps, "SM_HP_LR": os.environ["SM_HP_LR"]}), flush=True)
ckpt, step = pathlib.Path(os.environ["JOBPLANE_CHECKPOINT_DIR"]), 0

def stop(*_):
    (ckpt / "final.txt").write_text(str(step))
    print("got SIGTERM at step", step, flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
while True:
    step += 1
    diverged = step >= int(os.environ["SM_HP_NAN_AT"])
    print(f"step {step} loss {'nan' if diverged else round(1 / step, 4)}", flush=True)
    time.sleep(3600 if diverged else 0.02)  # only the agent can end it now
"""


def test_a_stop_on_match_stops_the_job_at_once_syncs_its_checkpoint_and_says_why(world: World) -> None:
    world.seed("nan-job", {"run": "python3 diverge.py", "stop_on": {"nan": True},
                           "hyperparameters": {"nan_at": 20, "lr": 0.01}}, code={"diverge.py": DIVERGE})
    node = world.start("nan-job")
    assert node.wait() == 0, console_of(node)

    report = world.json(keys.exit_report("nan-job", 1, 0))
    why = 'loss became nan at step 20: "step 20 loss nan"'
    assert (report["reason"], report["code"], report["error"]) == ("early-stop", 0, why)
    assert world.checkpoint("nan-job")["final.txt"] == b"20"  # the final sync ran
    logs = world.logs("nan-job")
    assert f"stop_on: {why}" in logs and "early-stop: SIGTERM to the process group" in logs
    assert "got SIGTERM at step 20" in logs
    assert json_line(logs, "hyperparameters ") == {"file": {"nan_at": "20", "lr": "0.01"}, "SM_HP_LR": "0.01"}

    chunks = [k for k, _, _ in world.reg.listing(keys.metrics_prefix(data_of(world.reg, "nan-job"), 1, 0))]
    samples = [s for k in chunks for s in metrics.decode(world.reg.get_bytes(k), 1, 0)]
    losses = [(s.step, s.value) for s in samples if s.name == "loss"]
    assert [step for step, _ in losses] == list(range(1, 21)) and math.isnan(losses[-1][1])
    assert losses[:2] == [(1, 1.0), (2, 0.5)]
    tagging = boto3.client("s3").get_object_tagging(Bucket="jobplane-agent-test", Key=world.reg.key(chunks[0]))
    assert tagging["TagSet"] == [{"Key": "jobplane:object", "Value": "log"}]  # expires with the logs
    assert world.poweroff_log.exists()
