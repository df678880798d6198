"""Multi-node on the local cloud, for real: the two ranks of examples/rendezvous.yaml meet through
MASTER_ADDR / MASTER_PORT with torch.distributed (gloo) and all-reduce a number; and every address the local
cloud hands an instance or shows a job is on loopback (127.0.0.0/8)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from jobplane.local.demo import CloudProcess
from jobplane.local.loopback import on_loopback
from jobplane.model import keys
from jobplane.model.states import State
from jobplane.store.registry import Registry
from tests.conftest import free_port

pytestmark = pytest.mark.scenario
SHARES_CLOUDS = ("aws",)  # quiet, to or from another module (conftest.Kept): none of its checks read others' jobs
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# What a job on a local instance sees of the network, printed as one JSON line per rank.
PROBE = '''\
import json, os, urllib.error, urllib.request
base = os.environ["AWS_EC2_METADATA_SERVICE_ENDPOINT"].rstrip("/")
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
put = urllib.request.Request(base + "/latest/api/token", method="PUT",
                             headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
token = opener.open(put, timeout=30).read().decode()
def meta(path):
    req = urllib.request.Request(base + "/latest/meta-data/" + path, headers={"X-aws-ec2-metadata-token": token})
    try:
        return opener.open(req, timeout=30).read().decode()
    except urllib.error.HTTPError as err:
        return None if err.code == 404 else "HTTP %d" % err.code
seen = {"rank": int(os.environ["NODE_RANK"]), "imds": base.split("//")[1].rsplit(":", 1)[0],
        "local-ipv4": meta("local-ipv4"), "public-ipv4": meta("public-ipv4"),
        "MASTER_ADDR": os.environ["MASTER_ADDR"], "SM_HOSTS": json.loads(os.environ["SM_HOSTS"]),
        "SM_CURRENT_HOST": os.environ["SM_CURRENT_HOST"],
        "resourceconfig": json.loads(os.environ["SM_RESOURCE_CONFIG"])["hosts"]}
print("ADDRESSES " + json.dumps(seen), flush=True)
'''


def rank_log(reg: Registry, job_id: str, rank: int) -> str:
    prefix = keys.logs_prefix(reg.job(job_id).data, 1, rank)
    return "".join(reg.get_bytes(k).decode() for k, _, _ in reg.listing(prefix))


@pytest.mark.timeout(420)
def test_two_ranks_meet_through_master_addr_and_all_reduce_on_loopback(cloud: CloudProcess, tmp_path: Path) -> None:
    assert importlib.util.find_spec("torch"), "torch is missing: `make .venv/.installed` installs the examples extra"
    code = tmp_path / "code"
    shutil.copytree(EXAMPLES / "rendezvous", code)
    (code / "addresses.py").write_text(PROBE)
    spec = tmp_path / "rendezvous.yaml"
    example = (EXAMPLES / "rendezvous.yaml").read_text()
    assert "run: python3 allreduce.py\n" in example
    # a free port: other jobs and tests on this machine share its loopback
    spec.write_text(example.replace("run: python3 allreduce.py", "run: python3 addresses.py && python3 allreduce.py")
                    + f"master_port: {free_port()}\n")

    done = cloud.cli("submit", str(spec), "--code", str(code), "-f", timeout=360)
    job_id = done.stdout.splitlines()[0] if done.stdout else ""
    assert done.returncode == 0, f"submit -f exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    reg = cloud.registry()
    record = reg.job(job_id)
    assert record.state == State.SUCCEEDED and len(record.instances) == 2

    probes: dict[int, dict[str, Any]] = {}
    for rank in (0, 1):
        text = rank_log(reg, job_id, rank)
        assert f"rank {rank}/2: all_reduce sum 3 (expected 3)" in text, f"rank {rank}'s log in the bucket:\n{text}"
        line = next((ln for ln in text.splitlines() if ln.startswith("ADDRESSES ")), None)
        assert line, f"rank {rank} printed no ADDRESSES line:\n{text}"
        probes[rank] = json.loads(line.removeprefix("ADDRESSES "))

    cluster = reg.get_json(keys.cluster(job_id, 1))
    raw = {i.id: i for i in cloud.instances() if i.id in record.instances}
    handed: dict[str, list[str | None]] = {
        "private IPs": [raw[i].private_ip for i in record.instances],
        "public IPs": [raw[i].public_ip for i in record.instances if raw[i].public_ip],
        "cluster.json hosts": cluster["hosts"], "cluster.json master_addr": [cluster["master_addr"]],
    }
    for rank, seen in probes.items():
        handed[f"rank {rank} IMDS endpoint"] = [seen["imds"]]
        handed[f"rank {rank} IMDS local-ipv4"] = [seen["local-ipv4"]]
        handed[f"rank {rank} IMDS public-ipv4"] = [seen["public-ipv4"]] if seen["public-ipv4"] else []
        handed[f"rank {rank} MASTER_ADDR"] = [seen["MASTER_ADDR"]]
        handed[f"rank {rank} SM_HOSTS"] = seen["SM_HOSTS"]
        handed[f"rank {rank} SM_CURRENT_HOST"] = [seen["SM_CURRENT_HOST"]]
        handed[f"rank {rank} resourceconfig hosts"] = seen["resourceconfig"]
    off = {what: addrs for what, addrs in handed.items() if not all(on_loopback(a) for a in addrs)}
    assert not off, f"addresses outside 127.0.0.0/8: {off}"
    # and they agree: each rank's IMDS address is its host in cluster.json, rank 0's is MASTER_ADDR
    assert [probes[r]["local-ipv4"] for r in (0, 1)] == cluster["hosts"] == handed["private IPs"]
    assert probes[0]["MASTER_ADDR"] == probes[1]["MASTER_ADDR"] == cluster["hosts"][0]
    assert all(seen["public-ipv4"] is None for seen in probes.values())


@pytest.mark.timeout(120)
def test_an_instance_started_by_hand_is_on_loopback_too(cloud: CloudProcess) -> None:
    done = cloud.cli("local", "instance", "--unmanaged")
    assert done.returncode == 0, done.stderr
    iid = done.stdout.strip()
    inst = next(i for i in cloud.instances(managed_only=False) if i.id == iid)
    assert on_loopback(inst.private_ip) and inst.public_ip is None, inst
    cloud.aws().terminate([iid])
