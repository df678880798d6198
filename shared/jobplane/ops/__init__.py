"""The job operations the SDK offers (jobplane.sdk; the CLI is built on that), and what they run over.

jobs.py     submit a drop, find a job, list jobs, read its logs, metrics and artifacts, follow it, cancel it
backend.py  a registry's store, code uploader and Compute adapter, built from Settings for its cloud (never
            shipped: only the SDK and the local cloud's demo connect this way)
(a sweep's operations are jobplane.sweeps.ops)
"""
