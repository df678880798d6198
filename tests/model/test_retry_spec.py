"""The spec's `retry:`: what validates, what is refused naming `retry.<field>` (parse_spec and `jobplane validate`),
and that a stored spec from a newer version with more retry fields still reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobplane.model.errors import SpecError
from jobplane.model.spec import JobSpec, Retry, known_fields, parse_spec, spec_to_json

BASE = "run: python3 train.py\ninstance_type: g5.xlarge\n"


def errors_of(doc: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(doc)
    return [str(e) for e in info.value.errors]


def test_the_full_form_and_the_defaults() -> None:
    spec = parse_spec(BASE + "retry: {max: 2, on_exit_codes: [42, 137], on_lost: true, on_stalled: true}\n")
    assert spec.retry == Retry(max=2, on_exit_codes=[42, 137], on_lost=True, on_stalled=True)
    assert parse_spec(BASE).retry is None, "unset: off"
    off = parse_spec(BASE + "retry: {on_lost: true}\n").retry
    assert off is not None and off.max == 0, "max defaults to 0: off, whatever it names"
    assert spec_to_json(spec)["retry"] == {"max": 2, "on_exit_codes": [42, 137], "on_lost": True, "on_stalled": True}


BAD = [
    ("retry: 2\n", "retry: Input should be a valid dictionary"),
    ("retry: {max: -1, on_lost: true}\n", "retry.max: Input should be greater than or equal to 0"),
    ("retry: {max: 101, on_lost: true}\n", "retry.max: Input should be less than or equal to 100"),
    ("retry: {max: many, on_lost: true}\n", "retry.max: Input should be a valid integer"),
    ("retry: {max: 2}\n", "retry.max: retries on nothing: give on_exit_codes, on_lost: true or on_stalled: true"),
    ("retry: {max: 2, on_exit_codes: 42}\n", "retry.on_exit_codes: Input should be a valid list"),
    ("retry: {max: 2, on_exit_codes: [0]}\n", "retry.on_exit_codes[0]: Input should be greater than or equal to 1"),
    ("retry: {max: 2, on_exit_codes: [42, 256]}\n",
     "retry.on_exit_codes[1]: Input should be less than or equal to 255"),
    ("retry: {max: 2, on_exit_codes: [42, 7, 42]}\n", "retry.on_exit_codes[2]: 42 is listed twice (also [0])"),
    ("retry: {max: 2, on_exit_codes: [" + ", ".join(map(str, range(1, 34))) + "]}\n",
     "retry.on_exit_codes: List should have at most 32 items"),
    ("retry: {max: 2, on_lost: maybe}\n", "retry.on_lost: Input should be a valid boolean"),
    ("retry: {max: 2, on_stalled: 3}\n", "retry.on_stalled: Input should be a valid boolean"),
    ("retry: {max: 2, on_exit_code: [42]}\n",
     "retry.on_exit_code: unknown field (allowed: max, on_exit_codes, on_lost, on_stalled)"),
]


@pytest.mark.parametrize(("doc", "expected"), BAD, ids=[e.split(":")[0] + " " + d.strip() for d, e in BAD])
def test_errors_name_the_field(doc: str, expected: str) -> None:
    assert any(e.startswith(expected) for e in errors_of(BASE + doc)), errors_of(BASE + doc)


def test_jobplane_validate_names_each_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE + "retry: {max: -1, on_exit_codes: [0, 42, 42], on_lost: maybe, on_stalled: 3, after: 1}\n")
    result = subprocess.run([sys.executable, "-m", "jobplane.cli", "validate", str(bad)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 1
    fields = {line.removeprefix(f"{bad}: ").split(":")[0] for line in result.stderr.strip().splitlines()}
    assert fields == {"retry.max", "retry.on_exit_codes[0]", "retry.on_exit_codes[2]", "retry.on_lost",
                      "retry.on_stalled", "retry.after"}, result.stderr


def test_a_stored_spec_with_retry_fields_from_a_newer_version_still_reads() -> None:
    raw = {"run": "x", "instance_type": "g5.xlarge", "retry": {"max": 1, "on_lost": True, "on_oom": True}}
    spec = JobSpec.model_validate(known_fields(raw))
    assert spec.retry == Retry(max=1, on_lost=True)
