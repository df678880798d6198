"""The store: the registry's objects under its root, and the job registry over them.

rooted.py    a rooted object store: raw keys under the registry's root, presigned URLs for VMs, listings
registry.py  the job registry: job.json by compare-and-swap transitions, its events, the active/ and preempted
             markers, the heartbeats listing; the only code that writes a job's record
"""
