"""What the server tests share: the ui extra (or a skip), and the app over an SDK client of an in-memory registry,
asked by starlette's TestClient as a browser on loopback would."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the ui extra is not installed (pip install -e '.[ui]')")
pytest.importorskip("httpx", reason="starlette's TestClient needs httpx (the dev extra)")

with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx still works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from jobplane import sdk
from jobplane.clouds.base import Compute
from jobplane.ops.jobs import Backend
from jobplane.settings import Settings
from jobplane.store.registry import Registry
from jobplane.ui.server import create_app


def over(reg: Registry, compute: Callable[[], Compute]) -> sdk.Client:
    """An SDK client of the in-memory registry, its VMs from compute."""
    return sdk.Client.from_settings(Settings(bucket="memory", root=reg.root),
                                    connected=Backend(reg, "s3://memory", compute, lambda key, path: None))


def served(client: sdk.Client, **options: Any) -> TestClient:
    return TestClient(create_app(client, **options), base_url="http://127.0.0.1:8765")
