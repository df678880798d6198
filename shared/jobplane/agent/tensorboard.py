"""The job's TensorBoard event files (and profiler traces written beside them), uploaded as they grow.

A SummaryWriter appends to its event file for the whole run, so a file is never "complete" the way a
checkpoint is: each sync uploads every file whose size, mtime or inode changed since it last went up, whole,
to teams/<owner>/<id>/tensorboard/<attempt>/<rank>/<path under log_dir>. A copy taken mid-append ends in a cut record,
which TensorBoard's reader stops at and reads past once the next sync replaces it; the final sync (at the end
and at a preemption, after the job's processes are gone) leaves every file whole. Uploads reuse
agent/transfer.py's parallel, retried transfers. With the job's secrets known (`redactor`), a file holding any form of
one goes up masked (agent/redact.mask_file: TensorBoard text summaries included), the file on the VM untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from jobplane.agent.redact import Redactor, mask_file
from jobplane.agent.transfer import Moved, Sleep, Stat, parallel, retried, scan, workers
from jobplane.model import keys
from jobplane.store.rooted import RootedStore


@dataclass
class EventUploader:
    reg: RootedStore
    local: Path  # the spec's tensorboard.log_dir on this machine
    data: keys.JobData  # the job's (JobRecord.data)
    attempt: int
    rank: int
    sleep: Sleep = time.sleep
    redactor: Callable[[], Redactor] = lambda: Redactor(())  # the job's secrets', once read (OutputLog.redactor)
    sent: dict[str, Stat] = field(default_factory=dict)  # what each file was when it last went up

    def sync(self) -> Moved:
        """Upload what changed since the last sync; a file whose upload failed goes again next time."""
        started = time.monotonic()
        store, prefix = self.reg.location(keys.tensorboard_prefix(self.data, self.attempt, self.rank))
        changed = {rel: st for rel, st in scan(self.local, lambda name: False).items() if self.sent.get(rel) != st}

        def upload(rel: str) -> int:
            path = self.local / rel
            redactor = self.redactor()
            if redactor:  # read whole to be masked: only a job with secrets pays for it
                data = mask_file(redactor, path.read_bytes())
                retried(f"upload {rel}", lambda: store.put(prefix + rel, data), sleep=self.sleep)
                return len(data)
            retried(f"upload {rel}", lambda: store.upload_file(prefix + rel, path), sleep=self.sleep)
            return changed[rel][0]

        done, errors = parallel(((rel, partial(upload, rel)) for rel in sorted(changed)), workers(store))
        for rel in done:
            self.sent[rel] = changed[rel]
        moved = Moved(files=len(done), bytes=sum(done.values()), seconds=time.monotonic() - started,
                      failed=sorted(errors))
        if errors:
            first = next(iter(errors.values()))
            raise RuntimeError(f"{len(errors)} of {len(changed)} TensorBoard files did not go up, e.g. "
                               f"{moved.failed[0]}: {first}") from first
        return moved
