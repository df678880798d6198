"""A job's secrets on its node: the agent reads them with the job's reader, gives them as variables and 0400 tmpfs
files, and redacts every form of each value from everything it uploads (agent/redact.py, agent/output.py). The job
runs for real (a shell, python3) over the real in-memory store; the bucket is scanned whole afterwards."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from pathlib import Path
from urllib.parse import quote

import pytest

from jobplane.agent import Agent, AgentConfig
from jobplane.agent.core import exit_report
from jobplane.agent.layout import Cluster, Layout, user_env
from jobplane.agent.output import OutputLog
from jobplane.agent.redact import Redactor, forms
from jobplane.agent.run import Outcome, Run
from jobplane.clouds.aws_imds import Ec2Metadata
from jobplane.clouds.base import TAG_ATTEMPT, TAG_JOB_ID
from jobplane.clouds.memory import MemorySecrets, MemoryStore
from jobplane.local.imds import FakeImds, ImdsInstance
from jobplane.model import keys
from jobplane.model.clock import utcnow
from jobplane.model.records import ClusterFile
from jobplane.model.secrets import MAX_VALUE
from jobplane.model.spec import parse_spec
from jobplane.model.states import State
from jobplane.store.registry import Registry

pytestmark = pytest.mark.timeout(60)


def printed_forms(value: bytes) -> list[bytes]:
    """How a script may print it: the forms the issue names, and base64 inside a longer encoding."""
    text = value.decode()
    return [value, base64.b64encode(value), base64.b64encode(b"x" + value + b"y"), quote(text, safe="").encode(),
            json.dumps({"token": text}).encode(), binascii.hexlify(value)]


def leaks(data: bytes, value: bytes) -> list[bytes]:
    return [f for f in forms(value) if f in data]


def test_every_printed_form_is_redacted_and_nothing_else() -> None:
    value = b"hf_Secr3t/Value+with=odd&chars\"q"
    redactor = Redactor([value])
    for form in printed_forms(value):
        out = redactor.redact(b"before " + form + b" after")
        assert not leaks(out, value) and out.startswith(b"before ") and out.endswith(b" after"), form
    assert redactor.redact(b"loss 0.25 step 10") == b"loss 0.25 step 10"


def test_a_value_split_across_two_writes_and_two_chunks_is_still_redacted() -> None:
    value = os.urandom(24).hex().encode()
    out = OutputLog(None)
    out.redact_with([value])
    out.user(b"token " + value[:11])  # a write without its newline: the pump hands it on as it is
    first = out.take()  # one chunk uploads here
    out.user(value[11:] + b" done\n")
    second = out.take()
    assert value[:11] not in first and not leaks(first + second, value)
    assert first + second == b"token *** done\n"
    multi = b"-----BEGIN KEY-----\nMIIabc123\n-----END KEY-----"  # a value of several lines: lines split it
    out.redact_with([multi])
    chunks = []
    for line in multi.split(b"\n"):
        out.user(line + b"\n")
        chunks.append(out.take())
    out.note("finished")  # the stream's end: whatever it held goes out, redacted
    chunks.append(out.take())
    assert multi not in b"".join(chunks) and b"***" in b"".join(chunks)


def test_a_64_kib_value_is_found_in_every_form() -> None:
    value = base64.b64encode(os.urandom(MAX_VALUE))[:MAX_VALUE]
    redactor = Redactor([value])
    for form in printed_forms(value):
        assert not leaks(redactor.redact(form), value)


def test_wandb_resumes_the_jobs_run_unless_the_spec_says_otherwise(tmp_path: Path) -> None:
    cluster = Cluster(hosts=("10.0.0.1",), master_addr="10.0.0.1", master_port=29500, num_nodes=1)

    def env(text: str, job: str) -> dict[str, str]:
        return user_env(spec=parse_spec("instance_type: t3.micro\nrun: x\n" + text), job_id=job, attempt=2, rank=0,
                        cluster=cluster, layout=Layout(tmp_path), num_gpus=0, num_cpus=1, base={})
    assert {k: v for k, v in env("", "exp-t003").items() if k.startswith("WANDB")} == {
        "WANDB_RUN_ID": "exp-t003", "WANDB_RESUME": "allow"}  # a trial's, or an array member's, own id
    assert env("env: {WANDB_RUN_ID: mine, WANDB_RESUME: never}\n", "j")["WANDB_RUN_ID"] == "mine"


def test_an_exit_reports_texts_are_redacted() -> None:
    value = b"s3cr3t-t0ken-value"
    run = Run(job_id="j", attempt=1, rank=0, instance_id="i-1", started_at=utcnow())
    outcome = Outcome(3, "stopped", error=f"failed: {value.decode()}", stopped_by="stop_on",
                      stop_reason=f"matched {base64.b64encode(value).decode()}")
    report = json.dumps(exit_report(run, outcome, utcnow(), Redactor([value]).text).body(), default=str).encode()
    assert not leaks(report, value) and b"***" in report


SCRIPT = r"""
import base64, binascii, hashlib, json, os, stat, sys, urllib.parse
v = os.environ["HF_TOKEN"].encode()
path = os.environ["WANDB_KEY_FILE"]
mode = stat.S_IMODE(os.stat(path).st_mode)
assert open(path, "rb").read() == v, "the file holds the value"
for i in range(1000):
    print(v.decode(), base64.b64encode(v).decode(), urllib.parse.quote(v.decode(), safe=""),
          json.dumps({"token": v.decode()}), binascii.hexlify(v).decode(), f"loss {i}")
print("sha256", hashlib.sha256(v).hexdigest(), "mode", oct(mode), "run", os.environ["WANDB_RUN_ID"])
sys.stdout.write(v.decode()[:9]); sys.stdout.flush(); sys.stdout.write(v.decode()[9:] + "\n")
raise SystemExit("giving up with " + v.decode())
"""


def test_a_job_sees_its_secrets_and_no_object_it_uploads_holds_one(tmp_path: Path) -> None:
    value = ("hf_" + os.urandom(16).hex()).encode()
    store, secrets = MemoryStore(), MemorySecrets()
    secrets.put("team-s", "hf-token", value)
    reg = Registry(store)
    (tmp_path / "job.py").write_text(SCRIPT)
    spec = parse_spec(f"instance_type: t3.micro\nowner: team-s\nrun: python3 {tmp_path / 'job.py'}\n"
                      "metrics: [{name: loss, regex: 'loss ([0-9]+)'}]\n"
                      "secrets: {HF_TOKEN: hf-token, WANDB_KEY_FILE: {name: hf-token, file: true}}\n", "sec-job")
    reg.create_job("sec-job", spec)
    reg.transition("sec-job", State.LAUNCHING, attempt=1)
    reg.put_json(keys.cluster("sec-job", 1), ClusterFile(job_id="sec-job", attempt=1, hosts=["10.1.1.1"],
                                                         master_addr="10.1.1.1", num_nodes=1).body())
    config = AgentConfig(ml_root=tmp_path / "ml", log_interval=0.2, heartbeat_interval=0.2, checkpoint_interval=0.3,
                         poll_interval=0.2, retry_attempts=2, retry_pause=0.01)
    with FakeImds(ImdsInstance("i-sec", tags={TAG_JOB_ID: "sec-job", TAG_ATTEMPT: "1"})) as imds:
        agent = Agent(reg, Ec2Metadata(imds.url), config, environ=os.environ, power_off=lambda: None,
                      secrets=secrets.get)
        assert agent.run() == 0
    report = reg.get_json(keys.exit_report("sec-job", 1, 0))
    assert report["code"] == 1
    everything = b"".join(store.get(info.key).data for info in store.list(""))
    assert hashlib.sha256(value).hexdigest().encode() in everything  # the job saw the right value
    assert b"mode 0o400" in everything and b"run sec-job" in everything
    assert everything.count(b"***") >= 5000
    assert not leaks(everything, value)
    assert not list(Path("/dev/shm").glob("jobplane-secrets-sec-job-*"))  # the file is gone with the job


def test_a_secret_the_job_may_not_read_fails_it_naming_the_field(tmp_path: Path) -> None:
    store = MemoryStore()
    reg = Registry(store)
    reg.create_job("sec-job", parse_spec("instance_type: t3.micro\nowner: team-s\nrun: echo hi\n"
                                         "secrets: {HF_TOKEN: gone}\n", "sec-job"))
    reg.transition("sec-job", State.LAUNCHING, attempt=1)
    reg.put_json(keys.cluster("sec-job", 1), ClusterFile(job_id="sec-job", attempt=1, hosts=["10.1.1.1"],
                                                         master_addr="10.1.1.1", num_nodes=1).body())
    config = AgentConfig(ml_root=tmp_path / "ml", retry_attempts=2, retry_pause=0.01)
    with FakeImds(ImdsInstance("i-sec", tags={TAG_JOB_ID: "sec-job", TAG_ATTEMPT: "1"})) as imds:
        Agent(reg, Ec2Metadata(imds.url), config, environ=os.environ, power_off=lambda: None,
              secrets=MemorySecrets().get).run()
    assert "secrets: " in reg.get_json(keys.exit_report("sec-job", 1, 0))["error"]


def test_a_tensorboard_text_summary_goes_up_masked_and_still_reads(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboardX import SummaryWriter

    from jobplane.agent.tensorboard import EventUploader
    from jobplane.model.keys import JobData

    value = b"wandb-" + os.urandom(12).hex().encode()
    logs = tmp_path / "tb"
    with SummaryWriter(str(logs)) as writer:
        writer.add_text("config", f"token={value.decode()} b64={base64.b64encode(value).decode()}", 1)
        writer.add_scalar("loss", 0.5, 1)
    reg = Registry(MemoryStore())
    data = JobData("tb-job", "team-s")
    EventUploader(reg, logs, data, 1, 0, redactor=lambda: Redactor([value])).sync()
    (key,) = [k for k, _, _ in reg.listing(keys.tensorboard_prefix(data, 1, 0))]
    uploaded = reg.get_bytes(key)
    assert not leaks(uploaded, value) and value in next(logs.iterdir()).read_bytes()  # the VM's file untouched
    copy = tmp_path / "copy" / "events.out.tfevents.1"
    copy.parent.mkdir()
    copy.write_bytes(uploaded)
    events = list(EventFileLoader(str(copy)).Load())  # TensorBoard's reader checks each record's CRC
    texts = [v.tensor.string_val[0] for e in events for v in e.summary.value if v.tag.startswith("config")]
    assert texts and all(b"*" * len(value) in t for t in texts)
    assert any(v.simple_value == 0.5 or v.tensor.float_val for e in events for v in e.summary.value if v.tag == "loss")
