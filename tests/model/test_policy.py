"""Platform policy: defaults when absent, field-named errors, effective per-job values."""

from __future__ import annotations

import pytest

from jobplane.model.errors import SpecError
from jobplane.model.policy import DEFAULT_POLICY, check_against_deployment, check_against_policy, parse_policy
from jobplane.model.spec import parse_spec


def test_absent_or_empty_policy_gives_defaults() -> None:
    assert parse_policy(None) == DEFAULT_POLICY
    assert parse_policy("  \n") == DEFAULT_POLICY
    assert DEFAULT_POLICY.allowed_instance_types == ["*"]


def test_unknown_policy_field_is_named() -> None:
    with pytest.raises(SpecError) as info:
        parse_policy("aws: {subnet: x}\n")
    assert str(info.value.errors[0]).startswith(
        "aws.subnet: unknown field (allowed: default_image, default_gpu_image, instance_profile")


def test_effective_values_respect_ceiling() -> None:
    policy = parse_policy("default_max_runtime: 2h\nmax_runtime_ceiling: 4h\ndefault_stall_timeout: 10m\n")
    spec = parse_spec("run: x\ninstance_type: t3.micro\n")
    assert policy.max_runtime(spec) == 7200 and policy.stall_timeout(spec) == 600
    long = parse_spec("run: x\ninstance_type: t3.micro\nmax_runtime: 1d\n")
    assert policy.max_runtime(long) == 4 * 3600
    assert [str(e) for e in check_against_policy(long, policy)] == ["max_runtime: 1d exceeds the policy ceiling of 4h"]


def test_instance_type_globs_apply_to_each_listed_type() -> None:
    policy = parse_policy("allowed_instance_types: ['g5.*', 'p4d.24xlarge']\n")
    spec = parse_spec("run: x\ninstance_type: [g5.xlarge, p4d.24xlarge, p5.48xlarge]\n")
    errors = check_against_policy(spec, policy)
    assert [e.path for e in errors] == ["instance_type[2]"]


@pytest.mark.parametrize(("spec", "cloud", "region", "fields"), [
    ("", "aws", "us-east-1", []),
    ("cloud: aws\nregion: us-east-1\nzones: [us-east-1a, us-east-1-bos-1a]\n", "aws", "us-east-1", []),
    ("cloud: gcp\nregion: us-central1\nzones: [us-central1-a]\n", "gcp", "us-central1", []),
    ("cloud: gcp\nregion: us-central1\n", "aws", "us-east-1", ["cloud"]),  # nothing more about another cloud
    ("", "gcp", "us-central1", ["cloud"]),  # cloud defaults to aws
    ("region: eu-west-1\n", "aws", "us-east-1", ["region"]),
    ("zones: [us-east-1a, us-west-2a]\n", "aws", "us-east-1", ["zones[1]"]),
    ("cloud: gcp\nzones: [europe-west10-a, europe-west1-b]\n", "gcp", "europe-west1", ["zones[0]"]),
    ("region: eu-west-1\nzones: [eu-west-1a]\n", "aws", None, []),  # the deployment's region is unknown
])
def test_a_spec_for_another_cloud_or_region_names_the_field(spec: str, cloud: str, region: str | None,
                                                            fields: list[str]) -> None:
    errors = check_against_deployment(parse_spec("run: x\ninstance_type: t3.micro\n" + spec), cloud, region)
    assert [e.path for e in errors] == fields


def test_the_reason_says_what_the_deployment_is_and_what_to_do() -> None:
    [default] = check_against_deployment(parse_spec("run: x\ninstance_type: n2-standard-4\n"), "gcp", "us-central1")
    assert str(default) == ("cloud: 'aws' (the default when cloud is not set) is not this deployment's cloud 'gcp': "
                            "submit the job to a deployment on aws, or set cloud: gcp")
    [region] = check_against_deployment(parse_spec("run: x\ninstance_type: t3.micro\nregion: eu-west-1\n"),
                                        "aws", "us-east-1")
    assert str(region) == ("region: 'eu-west-1' is not this deployment's region 'us-east-1': submit the job to a "
                           "deployment there, or drop the field")


def test_the_deployment_cap_is_bounded_and_a_job_that_can_never_fit_it_is_refused_naming_num_nodes() -> None:
    for bad in ("max_active_instances: 0\n", "max_active_instances: 100001\n", "max_active_instances_per_owner: -1\n"):
        with pytest.raises(SpecError) as info:
            parse_policy(bad)
        assert str(info.value.errors[0]).startswith(bad.split(":")[0] + ":"), bad
    spec = parse_spec("run: x\ninstance_type: t3.micro\nnum_nodes: 8\n")
    assert [str(e) for e in check_against_policy(spec, parse_policy("max_active_instances: 6\n"))] == [
        "num_nodes: 8 nodes can never fit the deployment's cap of 6 active instances (max_active_instances)"]
    assert parse_policy(None).max_active_instances is None


def test_numbers_and_flags_read_as_a_yaml_file_writes_them() -> None:
    """PyYAML (YAML 1.1) gives `1e6` as a string; a whole number may be written 8.0 or "8"; a flag yes or on."""
    policy = parse_policy("budgets: {monthly_usd: {team-a: 1e6}}\nmax_nodes_per_job: '8'\n"
                          "safety: {max_terminations_per_run: 5.0, dry_run: on}\naccess: {ssh: yes}\n")
    assert policy.budgets.monthly_usd == {"team-a": 1e6} and policy.max_nodes_per_job == 8
    assert policy.safety.max_terminations_per_run == 5 and policy.safety.dry_run and policy.access.ssh


@pytest.mark.parametrize(("text", "problem"), [
    ("max_nodes_per_job: true", "max_nodes_per_job: should be a whole number, got true/false True"),
    ("max_nodes_per_job: 1.5", "max_nodes_per_job: should be a whole number, got a number 1.5"),
    ("max_nodes_per_job: " + "9" * 40, "max_nodes_per_job: should be at most 100000, got 999999999999999999999..."),
    ("idle_gpu: {threshold: .nan}", "idle_gpu.threshold: should be a number, got a number out of range: nan"),
    ("prices: {g5.xlarge: 1e400}", "prices.g5.xlarge: should be a number, got a number out of range: inf"),
    ("owner_weights: {team-a: 0}", "owner_weights.team-a: should be more than 0, got 0"),
    ("access: {ssh: maybe}", "access.ssh: should be true or false, got a string 'maybe'"),
    ("idle_gpu: {action: kill}", "idle_gpu.action: should be one of 'warn', 'stop', 'off', got 'kill'"),
    ("aws: {subnets: subnet-1}", "aws.subnets: should be a list, got a string"),
    ("aws: {subnets: [subnet-1, 7]}", "aws.subnets[1]: should be a string, got a whole number"),
    ("aws: {instance_profile: " + "x" * 2049 + "}", "aws.instance_profile: should have at most 2048 characters, "
                                                    "got 2049"),
    ("priority_classes: {high: {owners: [a]}}", "priority_classes.high.value: required field is missing"),
    ("priority_classes: {High: {value: 1}}", "priority_classes.High: 'High' is not a valid name (it should match "
                                             "^[a-z][a-z0-9_-]{0,62}$)"),
    ("safety: 5", "safety: should be a mapping of fields, got a whole number"),
])
def test_each_problem_names_its_field_and_what_is_allowed(text: str, problem: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_policy(text)
    assert [str(e) for e in info.value.errors] == [problem]


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(SpecError) as info:
        parse_policy("max_nodes_per_job: 0\nbudgets: {monthly_usd: {Team: 1, team-b: -1}}\nidle_gpu: {window: 2d}\n"
                     "colour: blue\n")
    assert sorted(e.path for e in info.value.errors) == [
        "budgets.monthly_usd.Team", "budgets.monthly_usd.team-b", "colour", "idle_gpu.window", "max_nodes_per_job"]
