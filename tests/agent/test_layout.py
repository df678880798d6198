"""Pure pieces of the agent: paths, cluster parsing, environment, sharding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobplane.agent.layout import (
    Cluster,
    ClusterError,
    Layout,
    hyperparameters_file,
    relative_key,
    shard,
    user_env,
)
from jobplane.agent.transfer import safe_path
from jobplane.model.keys import split_uri
from jobplane.model.records import ClusterFile
from jobplane.model.spec import JobSpec, parse_spec


def test_paths_move_under_a_scratch_root_but_not_on_a_vm(tmp_path: Path) -> None:
    scratch = Layout(tmp_path)
    assert scratch.local("/opt/ml/checkpoints") == tmp_path / "checkpoints"
    assert scratch.local("/data/ckpt") == tmp_path / "fs" / "data" / "ckpt"
    assert Layout(Path("/opt/ml")).local("/data/ckpt") == Path("/data/ckpt")
    assert scratch.resource_config == tmp_path / "input" / "config" / "resourceconfig.json"


def test_cluster_json_must_include_this_node() -> None:
    file = ClusterFile(job_id="j", attempt=1, hosts=["10.0.0.1", "10.0.0.2"], master_addr="10.0.0.1", num_nodes=2)
    body = json.dumps(file.body())
    assert Cluster.parse(body, 1).hosts == ("10.0.0.1", "10.0.0.2")
    with pytest.raises(ClusterError, match=r"rank 2 is outside 0\.\.1"):
        Cluster.parse(body, 2)
    with pytest.raises(ClusterError, match="hosts has 2 entries but num_nodes is 3"):
        Cluster.parse(json.dumps({**file.body(), "num_nodes": 3}), 0)
    with pytest.raises(ClusterError, match=r"cluster\.json: field 'job_id': Field required"):
        Cluster.parse(json.dumps({"master_port": 1}), 0)
    with pytest.raises(ClusterError, match=r"cluster\.json: field 'master_port': Input should be less than 65536"):
        Cluster.parse(json.dumps({**file.body(), "master_port": 70000}), 0)


def test_user_env_ours_win_and_channels_are_named_like_sagemaker(tmp_path: Path) -> None:
    spec = JobSpec(instance_type="t3.micro", run="x", env={"NODE_RANK": "99", "LR": "0.1"},
                   inputs={"train-set": {"uri": "s3://b/p"}})
    cluster = Cluster(("10.0.0.1", "10.0.0.2"), "10.0.0.1", 29500, 2, "g5.xlarge")
    env = user_env(spec=spec, job_id="j", attempt=3, rank=1, cluster=cluster, layout=Layout(tmp_path),
                   num_gpus=4, num_cpus=8, base={"PATH": "/bin", "LR": "base"})
    assert env["NODE_RANK"] == "1" and env["LR"] == "0.1" and env["PATH"] == "/bin"
    assert env["SM_CHANNEL_TRAIN_SET"] == str(tmp_path / "input" / "data" / "train-set")
    assert json.loads(env["SM_CHANNELS"]) == ["train-set"]
    assert env["SM_CURRENT_HOST"] == "10.0.0.2" and env["SM_NUM_GPUS"] == "4"
    assert json.loads(env["SM_RESOURCE_CONFIG"])["current_instance_type"] == "g5.xlarge"
    seen = (Path(__file__).resolve().parents[2] / "docs" / "spec.md").read_text().split("## What the training code")[1]
    assert [name for name in env if name.startswith("JOBPLANE_") and f"`{name}`" not in seen] == []  # all named


def test_an_array_member_is_told_its_index_as_aws_batch_tells_it(tmp_path: Path) -> None:
    member = parse_spec("instance_type: t3.micro\nrun: x\narray: {size: 8, index: 5}\nlabels: {array: a}\n",
                        job_id="a-5")
    cluster = Cluster(("10.0.0.1",), "10.0.0.1", 29500, 1)
    env = user_env(spec=member, job_id="a-5", attempt=1, rank=0, cluster=cluster, layout=Layout(tmp_path),
                   num_gpus=0, num_cpus=2, base={})
    told = (env["JOBPLANE_ARRAY_INDEX"], env["AWS_BATCH_JOB_ARRAY_INDEX"], env["JOBPLANE_ARRAY_SIZE"])
    assert told == ("5", "5", "8")
    seen = (Path(__file__).resolve().parents[2] / "docs" / "spec.md").read_text().split("## What the training code")[1]
    assert [name for name in env if name.startswith("JOBPLANE_") and f"`{name}`" not in seen] == []  # all named
    plain = user_env(spec=parse_spec("instance_type: t3.micro\nrun: x\n"), job_id="j", attempt=1, rank=0,
                     cluster=cluster, layout=Layout(tmp_path), num_gpus=0, num_cpus=2, base={})
    assert not [name for name in plain if "ARRAY" in name]


def test_hyperparameters_reach_the_script_as_sagemaker_hands_them_over(tmp_path: Path) -> None:
    spec = parse_spec("instance_type: t3.micro\nrun: x\nenv: {SM_HP_LR: mine}\n"
                      "hyperparameters: {epochs: 10, lr: 0.01, optimizer: adam, amp: true, layers: [64, 32],\n"
                      "                  learning-rate: 1e-3, eps: '1e-3'}\n")
    assert hyperparameters_file(spec) == {"epochs": "10", "lr": "0.01", "optimizer": "adam", "amp": "true",
                                          "layers": "[64,32]", "learning-rate": "0.001", "eps": "1e-3"}
    cluster = Cluster(("10.0.0.1",), "10.0.0.1", 29500, 1)
    env = user_env(spec=spec, job_id="j", attempt=1, rank=0, cluster=cluster, layout=Layout(tmp_path),
                   num_gpus=0, num_cpus=2, base={})
    assert json.loads(env["SM_HPS"]) == {"epochs": 10, "lr": 0.01, "optimizer": "adam", "amp": True,
                                         "layers": [64, 32], "learning-rate": 0.001, "eps": "1e-3"}  # YAML 1.2
    assert (env["SM_HP_EPOCHS"], env["SM_HP_LR"], env["SM_HP_OPTIMIZER"], env["SM_HP_AMP"]) == \
        ("10", "0.01", "adam", "true")  # ours win over the spec's env
    assert env["SM_HP_LAYERS"] == "[64,32]" and env["SM_HP_LEARNING-RATE"] == "0.001"  # upper-cased as SageMaker does
    assert Layout(tmp_path).hyperparameters == tmp_path / "input" / "config" / "hyperparameters.json"


def test_sharding_deals_every_key_to_exactly_one_rank() -> None:
    keys = [f"k{i:02d}" for i in range(11)]
    shards = [shard(list(reversed(keys)), r, 3) for r in range(3)]
    assert sorted(k for s in shards for k in s) == keys
    assert shards[1] == ["k01", "k04", "k07", "k10"]


def test_uris_and_keys() -> None:
    assert split_uri("s3://bucket/a/b") == ("bucket", "a/b")
    assert split_uri("gs://bucket") == ("bucket", "")
    with pytest.raises(ValueError, match="not a bucket URI"):
        split_uri("/local/path")
    assert relative_key("data/train/x/y.csv", "data/train") == "x/y.csv"
    assert relative_key("data/vocab.txt", "data/vocab.txt") == "vocab.txt"
    with pytest.raises(ValueError, match="outside"):
        safe_path(Path("/tmp/d"), "../etc/passwd")
