"""The test modules' asserts rewritten once, by the controller, before the workers start.

pytest rewrites a test module's asserts when it first imports it and keeps the result in __pycache__ (a
`*-pytest-*.pyc`), so later runs only read it. On a fresh clone every xdist worker collects every module at once,
finds no such file, and rewrites all of them itself: four times 5 CPU seconds where one would do. Here the
controller writes the files first, with pytest's own functions, as its import hook would; a later run finds them
valid and does nothing. Should pytest's internals move, this does nothing and the workers rewrite as before.
"""

from __future__ import annotations

import contextlib
import fnmatch
import sys
from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist starts its workers (its own pytest_sessionstart)
def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None) or sys.dont_write_bytecode:
        return  # a worker; no workers (the one process rewrites each module once); or no cache to write
    with contextlib.suppress(ImportError, AttributeError, KeyError, TypeError):
        from _pytest.assertion import assertstate_key
        from _pytest.assertion.rewrite import (
            PYC_TAIL,
            _read_pyc,
            _rewrite_test,
            _write_pyc,
            get_cache_dir,
            try_makedirs,
        )

        state = config.stash[assertstate_key]
        for fn in rewritten(config):
            pyc = get_cache_dir(fn) / (fn.name[:-3] + PYC_TAIL)
            if try_makedirs(pyc.parent) and _read_pyc(fn, pyc, state.trace) is None:
                source_hash, co = _rewrite_test(fn, config)
                _write_pyc(state, co, source_hash, pyc)


def rewritten(config: pytest.Config) -> list[Path]:
    """What the workers' import hook rewrites: the test modules, the conftest.py files and the plugin modules
    tests/conftest.py names."""
    patterns = config.getini("python_files")
    tests = config.rootpath / "tests"
    found = [p for p in tests.rglob("*.py") if "__pycache__" not in p.parts
             and (p.name == "conftest.py" or any(fnmatch.fnmatch(p.name, pat) for pat in patterns))]
    from tests import conftest

    found += [config.rootpath.joinpath(*name.split(".")).with_suffix(".py") for name in conftest.pytest_plugins]
    return [p for p in found if p.is_file()]
