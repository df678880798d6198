"""Pure decisions of the reconcilers: plain data in (Snapshot), plain data out (Action). No I/O.

The same code runs on AWS and GCP; jobplane.control.reconcile builds snapshots and applies actions. The
launcher's decision (decide.launch) is the same shape over its own snapshot: a claimed job in, one step
(launch a candidate, wait, fail) out; jobplane.control.launcher applies each step and feeds the cloud's answer back.

How a check applies per-job timeouts without a GET per healthy job
-------------------------------------------------------------------
A job's stall_timeout, node count and uptime cap live in job.json, which we must not read for every
healthy job on every run. When the check moves a job to RUNNING (it holds the record then) it records
them in the same write (job.json's `limits`), and the job's RUNNING marker is named after them:
`active/<id>/RUNNING.<attempt>.nodes-<n>.stall-<s>.cap-<s>`. The listing of active/ the check makes anyway
then gives every running job's timeouts, and `check.candidates` can tell from listings alone (active/,
heartbeats/ and the managed-instance list) whether a RUNNING job is healthy: every rank beat within its
stall_timeout, some rank printed within it, and exactly num_nodes instances are pending/running. Only the
jobs that fail that test, are LAUNCHING, have a RUNNING marker written before markers carried the limits
(the check records them once, from the job's old limits/ key, which it lists only then: model.needs_old_limits),
have disagreeing markers, or were named by an event get job.json and an exit-report
listing (one LIST of attempts/<n>/nodes/ plus one GET per rank) fetched. Finished jobs show up there
because their agents stop beating and power off; the exit report's object-created event makes them a
candidate at once. The uptime cap reads its cap from the same marker. Stale keys of past attempts and ended
jobs are deleted by the check (Rule.CLEANUP), so every listing stays the size of the live working set.

Safety is part of the decision: terminations only name managed, unprotected instances
(`safety.terminable`), and `safety.limit_blast_radius` turns actions that would exceed the per-run
budget into refused actions, which the applier reports and never runs. Dry-run is the applier's.
"""

# Import what you use (from jobplane.decide import check; from jobplane.decide.model import Snapshot): the package
# imports none of its modules, so the launcher's cold start loads decide.launch and not the reconcilers' rules.
