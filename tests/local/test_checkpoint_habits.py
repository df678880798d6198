"""Spot jobs that checkpoint the way real scripts do, preempted mid-run on the local cloud (real moto, launcher,
rerun, bootstrap and agent): no rename-to-publish, no SIGTERM handler, saves every half second. Attempt 2 always
resumes from a whole file (the job loads it; a torn one would fail it): from at least the last step saved before
the notice less one save interval, or, where the agent's stop cut a save (its log says the file was left out), from
the version the log says stays or a newer whole copy, no older than one save cycle plus one sync period (the bound
docs/spec.md gives; the local cloud syncs every 5 s).
(A checkpoint of hundreds of MB saved in place more often than it can be copied, preempted at random moments, is
tests/agent/test_big_checkpoints.py: the real Keeper and the agent's own preemption, without a cloud.)"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from jobplane.local.demo import CloudProcess, poll
from jobplane.local.runner import AGENT_ENV
from jobplane.model import keys
from jobplane.model.states import State
from jobplane.ops import jobs
from tests.local.conftest import cli_ok, submit, write_spec

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(420)]
SHARES_CLOUDS = ("aws",)  # quiet, to or from another module (conftest.Kept): none of its checks read others' jobs

# checkpoint.json rewritten in place every 0.5 s; SIGTERM ignored, so only the SIGKILL after the grace ends it
JSON_EVERY_HALF_SECOND = """
import json, os, pathlib, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
path = pathlib.Path(os.environ["JOBPLANE_CHECKPOINT_DIR"]) / "checkpoint.json"
step = json.loads(path.read_text())["step"] if path.exists() else 0
print(f"resuming from step {step}", flush=True)
end = step + 4 if step else int(os.environ.get("STEPS", "60"))  # a resumed run trains a few steps more
while step < end:
    time.sleep(0.5)
    step += 1
    with open(path, "w") as f:
        f.write(json.dumps({"step": step}))
    print(f"saved step {step}", flush=True)
"""

# torch.save(state, "checkpoint.pt") every second, no signal handler (SIGTERM ends it at once). PyTorch is not in
# the local cloud's image, so `save` writes the file the way torch.save does: one zip archive (the pickled
# object, then a record per tensor), written in place through a single open(path, "wb"), never renamed.
TORCH_SAVE_EVERY_SECOND = """
import os, pathlib, pickle, time, zipfile

def save(state, path):
    with open(path, "wb") as f, zipfile.ZipFile(f, "w") as archive:
        archive.writestr("checkpoint/data.pkl", pickle.dumps({"step": state["step"]}))
        for i, tensor in enumerate(state["tensors"]):
            archive.writestr(f"checkpoint/data/{i}", tensor)

def load(path):
    with zipfile.ZipFile(path) as archive:  # a torn file is not a zip: BadZipFile, and the job fails
        return pickle.loads(archive.read("checkpoint/data.pkl"))

path = pathlib.Path(os.environ["JOBPLANE_CHECKPOINT_DIR"]) / "checkpoint.pt"
step = load(path)["step"] if path.exists() else 0
print(f"resuming from step {step}", flush=True)
tensors = [os.urandom(1 << 20) for _ in range(8)]  # 8 MB of weights
end = step + 3 if step else 90  # a resumed run trains a few more steps: attempt 1 is the one under test
while step < end:
    time.sleep(1.0)
    step += 1
    save({"step": step, "tensors": tensors}, path)
    print(f"saved step {step}", flush=True)
"""

def start(cloud: CloudProcess, tmp_path: Path, name: str, script: str, **extra: str) -> str:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(textwrap.dedent(script))
    spec = write_spec(tmp_path, name, "python3 train.py", max_restarts="2", max_runtime="15m", **extra)
    return submit(cloud, spec, code)


@pytest.fixture(scope="module")
def habits(cloud: CloudProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Both jobs' ids, submitted up front and preempted together, once each saved a few steps (the torch job
    described before, while its attempt 1 runs): each test then waits on its own job's attempt 2, and the torch job's
    8 MB saves every second stop as soon as they can. The JSON job would train 100 s unpreempted."""
    ids = {"habit-json": start(cloud, tmp_path_factory.mktemp("habit-json"), "habit-json", JSON_EVERY_HALF_SECOND,
                               env="{STEPS: '200'}"),
           "habit-torch": start(cloud, tmp_path_factory.mktemp("habit-torch"), "habit-torch",
                                TORCH_SAVE_EVERY_SECOND)}
    wait_saved(cloud, ids["habit-json"], 8)
    wait_saved(cloud, ids["habit-torch"], 6)
    ids["torch described"] = cli_ok(cloud, "describe", ids["habit-torch"])  # how old its newest checkpoint is
    for job_id in (ids["habit-json"], ids["habit-torch"]):
        preempt(cloud, job_id)
    return ids


def logs(cloud: CloudProcess, job_id: str, attempt: int) -> str:
    return cli_ok(cloud, "logs", job_id, "--attempt", str(attempt))


def saved(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"^saved step (\d+)$", text, re.M)]


def wait_saved(cloud: CloudProcess, job_id: str, step: int) -> None:
    """Until attempt 1's log says it saved `step`: read in-process, only the chunks not read yet (a CLI call per
    look would cost a third of a CPU second each on a loaded machine)."""
    data = keys.JobData(job_id, keys.DEFAULT_OWNER)  # its spec names no owner: the default one's folder
    reader, text = jobs.LogReader(cloud.registry(), data, attempt=1), list[str]()

    def reached() -> bool:
        text.extend(chunk.text for chunk in reader.new())
        return max(saved("".join(text)), default=0) >= step

    assert poll(reached, 180), f"{job_id} never saved step {step}: {logs(cloud, job_id, 1)}"


def preempt(cloud: CloudProcess, job_id: str) -> None:
    """A Spot interruption of attempt 1 with a 10 s notice, as the demo's."""
    cli_ok(cloud, "local", "preempt", job_id, "--grace", "10")


def before_the_notice(attempt_1: str) -> int:
    """The last step attempt 1 reported saved before the agent logged the Spot notice."""
    head, notice, _ = attempt_1.partition("] preempted: ")
    assert notice, f"no Spot notice in attempt 1's log:\n{attempt_1}"
    return max(saved(head), default=0)


def resumed_at(text: str) -> int:
    found = re.search(r"^resuming from step (\d+)", text, re.M)
    assert found, f"no 'resuming from step' line:\n{text}"
    return int(found[1])


def finished_on_attempt_2(cloud: CloudProcess, job_id: str) -> None:
    done = cloud.cli("wait", job_id, "--timeout", "300s", timeout=330)
    record = cloud.registry().job(job_id)
    assert (done.returncode, record.state, record.attempt) == (0, State.SUCCEEDED, 2), record.reason


def test_a_json_checkpoint_rewritten_in_place_every_half_second_ignoring_sigterm_resumes(
        cloud: CloudProcess, habits: dict[str, str]) -> None:
    job_id = habits["habit-json"]  # preempted once it saved step 8
    finished_on_attempt_2(cloud, job_id)
    first, second = logs(cloud, job_id, 1), logs(cloud, job_id, 2)
    assert "preempted: SIGTERM to the process group" in first
    assert resumed_at(second) >= before_the_notice(first) - 1, first
    assert re.search(r"restored 1 checkpoint files into .* \(manifest 0/\d+\.json, \d+ s old", second), second


def test_a_torch_save_in_place_every_second_without_a_signal_handler_resumes(
        cloud: CloudProcess, habits: dict[str, str]) -> None:
    job_id = habits["habit-torch"]  # preempted once it saved step 6
    described = habits["torch described"]  # while attempt 1 ran: how old its newest checkpoint was
    assert re.search(r"checkpoint  newest \d+s ago \(rank 0, attempt 1, 1 files, step \d+\)", described), described
    finished_on_attempt_2(cloud, job_id)
    first, second = logs(cloud, job_id, 1), logs(cloud, job_id, 2)
    assert "finished: reason=preempted code=143" in first  # SIGTERM ended it at once
    cut = re.search(r"checkpoint checkpoint\.pt left out: open for writing.*the previous version \(step (\d+)", first)
    if cut is None:  # the signal came between two saves: the last one went up in the final sync
        assert resumed_at(second) >= before_the_notice(first) - 1, first
    else:  # it came mid-save, which no handler finished: the bucket's version (or a newer whole copy) stays
        bound = 1 + float(AGENT_ENV["JOBPLANE_AGENT_CHECKPOINT_INTERVAL"])  # one save cycle (1 s) plus one sync
        assert int(cut[1]) <= resumed_at(second) and before_the_notice(first) - resumed_at(second) <= bound, first
