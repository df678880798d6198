"""The spec's `accelerators` and `spot` mapping: what validates, what is refused naming the field, the image and
the launch each picks (pure: no cloud)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from jobplane.decide import launch as launch_decide
from jobplane.model import accelerators, images
from jobplane.model.errors import SpecError
from jobplane.model.jobrecord import JobRecord
from jobplane.model.policy import Policy, policy_from
from jobplane.model.spec import JobSpec, known_fields, parse_spec, spec_to_json
from jobplane.model.states import State

GCE = "run: x\ncloud: gcp\n"
EC2 = "run: x\n"


def errors_of(doc: str) -> list[str]:
    with pytest.raises(SpecError) as err:
        parse_spec(doc)
    return [str(e) for e in err.value.errors]


@pytest.mark.parametrize(("doc", "model", "count"), [
    (GCE + "instance_type: n1-standard-8\naccelerators: {type: nvidia-tesla-t4, count: 1}\n", "T4", 1),
    (GCE + "instance_type: n1-standard-8\naccelerators: T4:1\n", "T4", 1),
    (GCE + "instance_type: n1-standard-16\naccelerators: ' v100 : 8 '\n", "V100", 8),
    (GCE + "instance_type: n1-highmem-8\naccelerators: P100\n", "P100", 1),
    (GCE + "instance_type: g2-standard-24\naccelerators: L4:2\n", "L4", 2),
    (GCE + "instance_type: a2-highgpu-2g\naccelerators: A100:2\n", "A100", 2),
    (GCE + "instance_type: a2-ultragpu-1g\naccelerators: nvidia-a100-80gb\n", "A100", 1),
    (EC2 + "instance_type: [g4dn.xlarge, g4dn.2xlarge]\naccelerators: T4:1\n", "T4", 1),
    (EC2 + "instance_type: g4dn.12xlarge\naccelerators: T4:4\n", "T4", 4),
    (EC2 + "instance_type: p3.2xlarge\naccelerators: V100\n", "V100", 1),
    (EC2 + "instance_type: g5.xlarge\naccelerators: A10G:1\n", "A10G", 1),
    (EC2 + "instance_type: g6.xlarge\naccelerators: {type: nvidia-l4}\n", "L4", 1),
    (EC2 + "instance_type: p4d.24xlarge\naccelerators: A100:8\n", "A100", 8),
])
def test_accelerators_that_fit_their_instance_types(doc: str, model: str, count: int) -> None:
    spec = parse_spec(doc)
    assert spec.accelerators is not None and (spec.accelerators.model, spec.accelerators.count) == (model, count)


def test_an_n1_type_without_accelerators_still_validates() -> None:
    assert parse_spec(GCE + "instance_type: n1-standard-8\n").accelerators is None


@pytest.mark.parametrize(("doc", "expected"), [
    (GCE + "instance_type: n1-standard-8\naccelerators: X100:1\n", "accelerators.type: unknown GPU 'X100'"),
    (GCE + "instance_type: n1-standard-8\naccelerators: T4:3\n",
     "accelerators: n1-standard-8 takes 1, 2 or 4 T4 GPUs (an N1 type on GCE), not 3"),
    (GCE + "instance_type: n1-standard-8\naccelerators: T4:0\n", "accelerators.count: Input should be greater"),
    (GCE + "instance_type: n1-standard-8\naccelerators: {type: T4, count: 17}\n", "accelerators.count: Input should"),
    (GCE + "instance_type: n1-standard-8\naccelerators: 'T4:two'\n", "accelerators: 'T4:two' is not a GPU and count"),
    (GCE + "instance_type: n1-standard-8\naccelerators: {type: T4, cards: 1}\n",
     "accelerators.cards: unknown field (allowed: type, count)"),
    (GCE + "instance_type: e2-standard-8\naccelerators: T4:1\n", "accelerators: e2-standard-8 takes no GPUs"),
    (GCE + "instance_type: n1-standard-8\naccelerators: L4:1\n", "accelerators: L4 GPUs do not attach to N1"),
    (GCE + "instance_type: n1-standard-8\naccelerators: K80:1\n", "accelerators.type: Compute Engine retired K80"),
    (GCE + "instance_type: g5.xlarge\naccelerators: A10G:1\n", "accelerators.type: A10G GPUs are EC2 only"),
    (GCE + "instance_type: a2-highgpu-1g\naccelerators: A100:2\n",
     "accelerators: a2-highgpu-1g comes with 1 A100 GPUs, not 2"),
    (EC2 + "instance_type: g5.xlarge\naccelerators: T4:1\n", "accelerators: g5.xlarge comes with A10G GPUs, not T4"),
    (EC2 + "instance_type: [g4dn.xlarge, m5.xlarge]\naccelerators: T4\n",
     "accelerators: m5.xlarge has no T4 GPUs (EC2 types with them: g4dn.*)"),
    (EC2 + "instance_type: g4dn.xlarge\naccelerators: T4:4\n", "accelerators: g4dn.xlarge comes with 1 T4 GPUs, not 4"),
    (EC2 + "instance_type: t3.micro\nspot: {after: 20m}\n", "spot.fallback: required field is missing"),
    (EC2 + "instance_type: t3.micro\nspot: {fallback: on_demand, after: 0}\n", "spot.after: duration must be positive"),
    (EC2 + "instance_type: t3.micro\nspot: {fallback: on_demand, after: soon}\n", "spot.after: invalid duration"),
    (EC2 + "instance_type: t3.micro\nspot: {fallback: spot}\n", "spot.fallback: Input should be 'on_demand'"),
    (EC2 + "instance_type: t3.micro\nspot: {fallback: on_demand, when: 1}\n",
     "spot.when: unknown field (allowed: fallback, after)"),
    (EC2 + "instance_type: t3.micro\nspot: maybe\n", "spot: Input should be a valid boolean"),
])
def test_bad_accelerators_and_spot_name_the_field(doc: str, expected: str) -> None:
    found = errors_of(doc)
    assert any(e.startswith(expected) for e in found), found
    assert not any(e.startswith("spot: Input should be a valid boolean") for e in found if "spot." in expected)


def test_spot_true_false_and_the_fallback_mapping() -> None:
    assert (parse_spec(EC2 + "instance_type: t3.micro\n").uses_spot, parse_spec(EC2 + "instance_type: t3.micro\n")
            .spot_fallback_after) == (False, None)
    plain = parse_spec(EC2 + "instance_type: t3.micro\nspot: true\n")
    assert (plain.uses_spot, plain.spot_fallback_after, spec_to_json(plain)["spot"]) == (True, None, True)
    fallback = parse_spec(EC2 + "instance_type: t3.micro\nspot: {fallback: on_demand, after: 20m}\n")
    assert (fallback.uses_spot, fallback.spot_fallback_after) == (True, 1200)
    assert spec_to_json(fallback)["spot"] == {"fallback": "on_demand", "after": 1200}
    assert parse_spec(EC2 + "instance_type: t3.micro\nspot: {fallback: on_demand}\n").spot_fallback_after == 1800
    # the stored spec reads back, and a newer version's nested fields are ignored
    stored = {**spec_to_json(fallback), "spot": {"fallback": "on_demand", "after": 1200, "newer": 1}}
    assert JobSpec.model_validate(known_fields(stored)) == fallback


def test_accelerators_pick_the_gpu_image_and_attach_only_on_n1() -> None:
    policy = policy_from({"gcp": {"default_image": "debian-12", "default_gpu_image": "ubuntu-24.04-gpu"}})
    gpu, cpu = (parse_spec(GCE + "instance_type: n1-standard-8\n" + extra) for extra in ("accelerators: T4:2\n", ""))
    assert policy.image(gpu, "n1-standard-8") == "ubuntu-24.04-gpu"
    assert policy.image(cpu, "n1-standard-8") == "debian-12"
    assert accelerators.guest_accelerator("gcp", "T4", 2, "n1-standard-8") == ("nvidia-tesla-t4", 2)
    assert accelerators.guest_accelerator("gcp", "L4", 1, "g2-standard-8") is None  # it comes with the type
    assert accelerators.guest_accelerator("aws", "T4", 1, "g4dn.xlarge") is None
    step = launch_decide.decide(snapshot(gpu), NOW)
    assert isinstance(step, launch_decide.Launch) and step.accelerator == ("nvidia-tesla-t4", 2)
    assert step.image == images.resolve("gcp", images.DEFAULT_GPU, "n1-standard-8")


NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def snapshot(spec: JobSpec, **record: object) -> launch_decide.LaunchSnapshot:
    from jobplane.boot import agent_bundle

    fields = {"id": "j", "spec": spec, "state": State.LAUNCHING, "attempt": 1, "created_at": NOW, "updated_at": NOW,
              "state_since": NOW, **record}
    agents = tuple(agent_bundle.Variant(spec.cloud, py, images.X86_64, "0" * 64, 1) for py in images.python_versions())
    return launch_decide.LaunchSnapshot(JobRecord.model_validate(fields), Policy(), agents=agents)


def test_the_fallback_decision_over_time() -> None:
    spec = parse_spec(EC2 + "instance_type: t3.micro\nzones: [us-east-1a, us-east-1b]\n"
                            "spot: {fallback: on_demand, after: 20m}\n")
    refused = tuple(launch_decide.Tried("t3.micro", z, "no Spot", spot=True) for z in ("us-east-1a", "us-east-1b"))
    first = launch_decide.decide(snapshot(spec), NOW)
    assert isinstance(first, launch_decide.Launch) and first.spot and first.fallback is None
    # every Spot candidate refused for the first time: wait, the clock starts now
    wait = launch_decide.decide(replace_tried(snapshot(spec), refused), NOW)
    assert isinstance(wait, launch_decide.Wait) and wait.spot_refused_at == NOW
    # 19 minutes on, the backoff's 16 minutes end at the fallback, not after it
    later = NOW + timedelta(minutes=19)
    snap = snapshot(spec, spot_refused_at=NOW, waits=4)
    wait = launch_decide.decide(replace_tried(snap, refused), later)
    assert isinstance(wait, launch_decide.Wait) and wait.until == NOW + timedelta(minutes=20)
    # at 20 minutes: Spot is still asked first, then the first candidate on-demand
    due = NOW + timedelta(minutes=20)
    step = launch_decide.decide(replace_tried(snap, refused), due)
    assert isinstance(step, launch_decide.Launch) and not step.spot and step.zone == "us-east-1a"
    assert step.fallback == "on-demand: Spot refused in every zone and type for 20m"
    # spot: true never falls back
    plain = parse_spec(EC2 + "instance_type: t3.micro\nzones: [us-east-1a, us-east-1b]\nspot: true\n")
    assert isinstance(launch_decide.decide(replace_tried(snapshot(plain, spot_refused_at=NOW), refused),
                                           NOW + timedelta(days=1)), launch_decide.Wait)


def replace_tried(snap: launch_decide.LaunchSnapshot,
                  tried: tuple[launch_decide.Tried, ...]) -> launch_decide.LaunchSnapshot:
    for t in tried:
        snap = snap.after(t)
    return snap


def test_validate_names_accelerators_and_spot(tmp_path: Path) -> None:
    bad, unknown, cpu = tmp_path / "gpu.yaml", tmp_path / "unknown.yaml", tmp_path / "n1.yaml"
    bad.write_text(GCE + "instance_type: n1-standard-8\naccelerators: T4:3\nspot: {fallback: on_demand, after: 0}\n")
    unknown.write_text(GCE + "instance_type: n1-standard-8\naccelerators: {type: nvidia-tesla-x1, count: 1}\n")
    cpu.write_text(GCE + "instance_type: n1-standard-8\nspot: {fallback: on_demand, after: 20m}\n")
    result = subprocess.run([sys.executable, "-m", "jobplane.cli", "validate", str(bad), str(unknown), str(cpu)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert f"{bad}: accelerators: n1-standard-8 takes 1, 2 or 4 T4 GPUs" in result.stderr, result.stderr
    assert f"{bad}: spot.after: duration must be positive" in result.stderr
    assert f"{unknown}: accelerators.type: unknown GPU 'nvidia-tesla-x1'" in result.stderr
    assert str(cpu) not in result.stderr
