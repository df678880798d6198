"""jobplane: serverless control plane for ML training on plain cloud VMs.

`from jobplane import Client` is the SDK (jobplane.sdk), imported on first use: what a deployment runs (the
functions, the agent) imports this package without it, and never ships it. Its type is in __init__.pyi.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["Client", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        # By name, not an import statement: the bundle checks (tests/infra/test_bundle.py) import every import
        # that is not at a shipped module's top as one a run may need, and no deployment reads jobplane.Client.
        return importlib.import_module("jobplane.sdk").Client
    raise AttributeError(f"module 'jobplane' has no attribute {name!r}")
