"""jobplane: serverless control plane for ML training on plain cloud VMs."""

__version__ = "0.1.0"
