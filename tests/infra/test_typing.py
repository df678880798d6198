"""mypy follows only the aws_cdk modules infra/ and app.py import (pyproject.toml): one imported but not listed
would be checked as Any, silently. This keeps the list equal to the imports."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_follows_exactly_the_cdk_modules_the_deployment_code_imports() -> None:
    sources = [*sorted((ROOT / "infra").rglob("*.py")), ROOT / "app.py"]
    imported = {"aws_cdk"} | {f"aws_cdk.{m}" for path in sources
                              for m in re.findall(r"^from aws_cdk import (aws_\w+)", path.read_text(), re.M)}
    imported |= {m for path in sources for m in re.findall(r"^(?:from|import) (aws_cdk\.\w+)", path.read_text(), re.M)}
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    followed = {m for o in overrides if o.get("follow_imports") == "normal" for m in o["module"]}
    skipped = [o["module"] for o in overrides if o.get("follow_imports") == "skip"]
    assert ["aws_cdk.*"] in skipped  # the rest of aws_cdk is Any
    assert followed == imported
