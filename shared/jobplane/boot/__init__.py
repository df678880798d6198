"""What a VM boots from and a deployment ships.

bootstrap.py     the VM's startup script: fetch the agent bundle and start the agent (python3 only)
agent_bundle.py  the agent bundle's layout: its variants (cloud, Python, architecture) and their manifest
bundling.py      builds agent bundles, and says what each cloud's deployment ships (never the CLI, the SDK, the
                 dashboard, the local cloud or a fake)
"""
