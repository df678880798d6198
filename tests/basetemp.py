"""The old sessions' temporary directories go while this session tests, not after its last test.

pytest keeps the base temporary directories of the last 3 sessions (tmp_path_retention_count) and deletes older
ones when a session ends, in the controller, after the last test. A `make test` leaves about 3 GB in 190,000
files (local VMs' disks, CDK outputs, checkpoints), and deleting one took 9-14 s in which nothing else ran. Here
the controller deletes them from a thread as the session starts, with pytest's own rules (a directory still
locked by a live session stays), and waits for that thread before pytest's own cleanup, which then has nothing
left to do.
"""

from __future__ import annotations

import threading

import pytest
from _pytest.pathlib import LOCK_TIMEOUT, cleanup_numbered_dir

_cleaner: threading.Thread | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _cleaner
    config = session.config
    if hasattr(config, "workerinput") or config.option.basetemp:
        return  # a worker's base is under the controller's; a --basetemp is the user's, with no numbered siblings
    keep = int(config.getini("tmp_path_retention_count"))
    if config.getini("tmp_path_retention_policy") != "all" or keep < 1:
        return
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]  # pytest's, as xdist uses
    basetemp = factory.getbasetemp()  # this session's, made now as xdist would make it for its workers
    _cleaner = threading.Thread(target=cleanup_numbered_dir, name="old-basetemps", daemon=True,
                                args=(basetemp.parent, "pytest-", keep, basetemp.stat().st_mtime - LOCK_TIMEOUT))
    _cleaner.start()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    if _cleaner is not None:
        _cleaner.join()  # before pytest's own cleanup, which would delete the same directories
