"""jobplane: serverless control plane for ML training on plain cloud VMs.

`from jobplane import Client` is the SDK (jobplane.sdk), imported on first use: what a deployment runs (the
functions, the agent) imports this package without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobplane.sdk import Client

__version__ = "0.1.0"
__all__ = ["Client", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from jobplane.sdk import Client

        return Client
    raise AttributeError(f"module 'jobplane' has no attribute {name!r}")
