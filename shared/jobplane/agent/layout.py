"""Where things live on the VM and what the user process is told: pure functions, no I/O.

The SageMaker layout under the ML root (/opt/ml on a VM; a scratch dir in tests and the local cloud):
  code/                      the unpacked code bundle; `setup` and `run` start here
  input/data/<channel>/      inputs, SM_CHANNEL_<CHANNEL>
  input/config/resourceconfig.json
  input/config/hyperparameters.json   the spec's hyperparameters, each value a string (also SM_HPS, SM_HP_<NAME>)
  model/                     SM_MODEL_DIR (spec.artifacts_dir, default /opt/ml/model)
  checkpoints/               JOBPLANE_CHECKPOINT_DIR (spec.checkpoint_dir, default /opt/ml/checkpoints)
  output/data/               SM_OUTPUT_DATA_DIR
  env/                       the job environment a code/requirements.txt is installed into
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from jobplane.model.records import ClusterFile, RecordError
from jobplane.model.spec import JobSpec
from jobplane.model.specfields import hp_string

SAGEMAKER_ROOT = PurePosixPath("/opt/ml")
GROUP = "homogeneousCluster"


class ClusterError(ValueError):
    """cluster.json does not describe a cluster this node belongs to."""


class _Under:
    """A fixed path under a Layout's ML root (the tree in this module's docstring)."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __get__(self, layout: Layout, owner: type[Layout] | None = None) -> Path:
        return layout.ml_root.joinpath(*self.parts)


@dataclass(frozen=True)
class Layout:
    ml_root: Path

    def local(self, spec_path: str) -> Path:
        """A spec's absolute path on this machine. With a non-default ML root (tests, the local cloud)
        every path moves under it, so nothing outside the scratch root is ever written:
        /opt/ml/x -> <root>/x, any other /a/b -> <root>/fs/a/b."""
        if self.ml_root == Path(SAGEMAKER_ROOT):
            return Path(spec_path)
        pure = PurePosixPath(spec_path)
        if pure.is_relative_to(SAGEMAKER_ROOT):
            return self.ml_root / pure.relative_to(SAGEMAKER_ROOT)
        return self.ml_root / "fs" / pure.relative_to("/")

    code_dir = _Under("code")
    job_env = _Under("env")
    input_dir = _Under("input")
    config_dir = _Under("input", "config")
    resource_config = _Under("input", "config", "resourceconfig.json")
    hyperparameters = _Under("input", "config", "hyperparameters.json")
    output_dir = _Under("output")
    output_data_dir = _Under("output", "data")

    def channel_dir(self, name: str) -> Path:
        return self.input_dir / "data" / name


@dataclass(frozen=True)
class Cluster:
    """attempts/<n>/cluster.json, as the launcher wrote it."""

    hosts: tuple[str, ...]
    master_addr: str
    master_port: int
    num_nodes: int
    instance_type: str | None = None
    instances: tuple[str, ...] = ()
    idle_window: float | None = None  # seconds: mark this node idle when its mean GPU use over it is low
    idle_threshold: float | None = None  # percent

    @classmethod
    def parse(cls, body: bytes | str, rank: int) -> Cluster:
        """cluster.json as the launcher wrote it (jobplane.model.records.ClusterFile), for the node of this rank."""
        try:
            file = ClusterFile.parse(body)
        except RecordError as exc:
            raise ClusterError(str(exc)) from None
        if len(file.hosts) != file.num_nodes:
            raise ClusterError(f"cluster.json: hosts has {len(file.hosts)} entries but num_nodes is {file.num_nodes}")
        if not 0 <= rank < file.num_nodes:
            raise ClusterError(f"cluster.json: this node's rank {rank} is outside 0..{file.num_nodes - 1}")
        idle = file.idle_gpu
        return cls(hosts=tuple(file.hosts), master_addr=file.master_addr, master_port=file.master_port,
                   num_nodes=file.num_nodes, instance_type=file.instance_type, instances=tuple(file.instances),
                   idle_window=idle.window if idle else None, idle_threshold=idle.threshold if idle else None)


def channel_env_name(name: str) -> str:
    return "SM_CHANNEL_" + name.upper().replace("-", "_")


def resource_config(cluster: Cluster, rank: int) -> dict[str, Any]:
    """SageMaker's resourceconfig.json. Hosts are the nodes' private addresses (resolvable, unlike algo-N)."""
    hosts = list(cluster.hosts)
    return {
        "current_host": hosts[rank],
        "current_instance_type": cluster.instance_type or "",
        "current_group_name": GROUP,
        "hosts": hosts,
        "instance_groups": [{"instance_group_name": GROUP, "instance_type": cluster.instance_type or "",
                             "hosts": hosts}],
        "network_interface_name": "eth0",
    }


def hyperparameters_file(spec: JobSpec) -> dict[str, str]:
    """hyperparameters.json as SageMaker writes it: every value a string ({"epochs": "10", "lr": "0.01"})."""
    return {name: hp_string(value) for name, value in spec.hyperparameters.items()}


def hyperparameter_env(spec: JobSpec) -> dict[str, str]:
    """As SageMaker's training toolkit sets them: SM_HPS, the hyperparameters as one JSON object with their
    types; SM_HP_<NAME>, the name upper-cased (hyphens and dots kept), the value a string."""
    hps = spec.hyperparameters
    return {"SM_HPS": json.dumps(hps, sort_keys=True, separators=(",", ":")),
            **{f"SM_HP_{name.upper()}": hp_string(value) for name, value in hps.items()}}


def user_env(*, spec: JobSpec, job_id: str, attempt: int, rank: int, cluster: Cluster, layout: Layout,
             num_gpus: int, num_cpus: int, base: dict[str, str]) -> dict[str, str]:
    """The user process's environment: base (the agent's), the experiment trackers' defaults, the spec's env,
    then ours (ours win). WANDB_RUN_ID is the job's id (a sweep trial's or an array member's own) and WANDB_RESUME
    allow, unless the spec sets them: a W&B run goes on across Spot reruns instead of starting anew."""
    env = {**base, "PYTHONUNBUFFERED": "1", "WANDB_RUN_ID": job_id, "WANDB_RESUME": "allow", **spec.env}
    hosts = list(cluster.hosts)
    env.update({
        "JOBPLANE_JOB_ID": job_id,
        "JOBPLANE_ATTEMPT": str(attempt),
        "JOBPLANE_CHECKPOINT_DIR": str(layout.local(spec.checkpoint_dir)),
        "JOBPLANE_ARTIFACTS_DIR": str(layout.local(spec.artifacts_dir)),
        "NODE_RANK": str(rank),
        "NNODES": str(cluster.num_nodes),
        "MASTER_ADDR": cluster.master_addr,
        "MASTER_PORT": str(cluster.master_port),
        "SM_MODEL_DIR": str(layout.local(spec.artifacts_dir)),
        "SM_INPUT_DIR": str(layout.input_dir),
        "SM_INPUT_CONFIG_DIR": str(layout.config_dir),
        "SM_OUTPUT_DIR": str(layout.output_dir),
        "SM_OUTPUT_DATA_DIR": str(layout.output_data_dir),
        "SM_CHANNELS": json.dumps(sorted(spec.inputs)),
        "SM_HOSTS": json.dumps(hosts),
        "SM_CURRENT_HOST": hosts[rank],
        "SM_CURRENT_INSTANCE_TYPE": cluster.instance_type or "",
        "SM_NUM_GPUS": str(num_gpus),
        "SM_NUM_CPUS": str(num_cpus),
        "SM_RESOURCE_CONFIG": json.dumps(resource_config(cluster, rank)),
    })
    if spec.array is not None and spec.array.index is not None:  # a member of an array: which one (AWS Batch's too)
        env.update({"JOBPLANE_ARRAY_INDEX": str(spec.array.index), "AWS_BATCH_JOB_ARRAY_INDEX": str(spec.array.index),
                    "JOBPLANE_ARRAY_SIZE": str(spec.array.size)})
    if spec.tensorboard is not None:  # where the job's SummaryWriter writes: the agent uploads from there
        env["JOBPLANE_TENSORBOARD_DIR"] = str(layout.local(spec.tensorboard.log_dir))
    env.update({channel_env_name(name): str(layout.channel_dir(name)) for name in spec.inputs})
    env.update(hyperparameter_env(spec))
    return env


def shard(keys: list[str], rank: int, num_nodes: int) -> list[str]:
    """ShardedByS3Key: the keys in sorted order, dealt round-robin; rank r gets keys r, r+n, r+2n..."""
    return sorted(keys)[rank::num_nodes]


def relative_key(key: str, prefix: str) -> str:
    """The local path of a downloaded key under its channel dir: the part after the prefix, or its name
    when the prefix names the object itself."""
    rel = key[len(prefix):].lstrip("/")
    return rel or PurePosixPath(key).name
