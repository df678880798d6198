"""The agent's TensorBoard uploads: the files under the spec's log_dir go up as they grow (each whole, only those
changed since they last went up), per attempt and rank; a failed upload goes again at the next sync."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobplane.agent.tensorboard import EventUploader
from jobplane.model import keys
from jobplane.store.registry import Registry
from tests.agent.conftest import FlakyStore

pytestmark = pytest.mark.timeout(10)
TB = keys.JobData("tb-job", "team-tb")


def test_event_files_go_up_as_they_grow_and_only_what_changed(tmp_path: Path) -> None:
    store = FlakyStore()
    reg = Registry(store, "root")
    logdir = tmp_path / "tensorboard"
    (logdir / "train").mkdir(parents=True)
    events = logdir / "train" / "events.out.tfevents.1.host"
    events.write_bytes(b"record-1")
    uploader = EventUploader(reg, logdir, TB, 2, 1, sleep=lambda _: None)
    assert uploader.sync().files == 1
    key = keys.tensorboard_prefix(TB, 2, 1) + "train/events.out.tfevents.1.host"
    assert reg.get_bytes(key) == b"record-1"
    assert uploader.sync().files == 0  # nothing changed: nothing goes up

    with events.open("ab") as f:
        f.write(b"record-2")
    (logdir / "plugins" / "profile").mkdir(parents=True)
    (logdir / "plugins" / "profile" / "host.pt.trace.json").write_text("{}")  # a profiler trace beside them
    store.failures = {"profile": 3}  # the trace fails all three tries of this sync
    with pytest.raises(RuntimeError, match="1 of 2 TensorBoard files did not go up"):
        uploader.sync()
    assert reg.get_bytes(key) == b"record-1record-2"
    moved = uploader.sync()  # the next sync sends only the one that failed
    assert (moved.files, moved.bytes) == (1, 2)
    assert reg.get_bytes(keys.tensorboard_prefix(TB, 2, 1) + "plugins/profile/host.pt.trace.json") == b"{}"


def test_a_log_dir_the_job_never_made_uploads_nothing(tmp_path: Path) -> None:
    reg = Registry(FlakyStore(), "root")
    assert EventUploader(reg, tmp_path / "absent", TB, 1, 0).sync().files == 0
    assert not list(reg.listing(keys.tensorboard_prefix(TB)))
