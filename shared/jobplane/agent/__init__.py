"""The on-VM agent: `python3 -m jobplane.agent --cloud aws --bucket B` (see agent/cli.py for every flag)."""

from jobplane.agent.core import Agent, AgentConfig

__all__ = ["Agent", "AgentConfig"]
