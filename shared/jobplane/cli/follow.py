"""Following a job from the command line (`submit -f`, `logs -f`, `wait`): its status line, its output, and the
exit code its outcome gives."""

from __future__ import annotations

import shutil
import sys
from typing import TextIO

import click

from jobplane import jobs
from jobplane.jobview import Status


class StatusLine:
    """A job's one-line status on stderr: rewritten in place on a terminal; elsewhere (a log, a pipe) one line
    each time the phase changes, so the record stays readable."""

    def __init__(self) -> None:
        self.err: TextIO = sys.stderr
        self.tty = self.err.isatty()
        self.text = ""
        self.phase: str | None = None

    def show(self, status: Status) -> None:
        if self.tty:  # one screen line, or clearing it would leave the wrapped rest behind
            self.text = status.text[:max(20, shutil.get_terminal_size().columns - 1)]
            self.err.write("\r\x1b[K" + self.text)
            self.err.flush()
        elif status.phase != self.phase:
            click.echo(f"status: {status.text}", err=True)
        self.phase = status.phase

    def above(self, text: str) -> None:
        """Print job output to stdout with the status line kept below it."""
        self.clear()
        click.echo(text, nl=not text.endswith("\n") and bool(text))
        if self.tty and self.text:
            self.err.write(self.text)
            self.err.flush()

    def clear(self) -> None:
        if self.tty and self.text:
            self.err.write("\r\x1b[K")
            self.err.flush()

    def end(self) -> None:
        """The status line is done: what follows starts on a clean line."""
        self.clear()
        self.text = ""


def follow_job(backend: jobs.Backend, job_id: str, goal: jobs.Goal, *, interval: float, timeout: float | None = None,
               logs: bool = False, attempt: int | None = None, rank: int | None = None) -> int:
    """Follow a job to goal with a status line (and its output with logs); return the exit code to use.

    Ctrl-C stops following, never the job."""
    line = StatusLine()
    try:
        first = jobs.find(backend.reg, job_id)  # a job that does not exist is an error at once
        many_nodes = first.num_nodes > 1 and rank is None
        reran = attempt is None and first.attempt > 1

        def on_chunk(chunk: jobs.Chunk) -> None:
            tag = many_nodes or (attempt is None and (reran or chunk.attempt > 1))
            line.above(jobs.tagged(chunk) if tag else chunk.text)

        how = jobs.Follow(on_status=line.show, on_chunk=on_chunk,
                          logs=jobs.LogReader(backend.reg, job_id, attempt, rank) if logs else None,
                          compute=backend.compute, interval=interval, timeout=timeout)
        view = jobs.follow(backend.reg, job_id, goal, how)
    except KeyboardInterrupt:
        line.end()
        click.echo(f"stopped following {job_id}; the job goes on (`jobplane cancel {job_id}` stops it)", err=True)
        return jobs.EXIT_INTERRUPTED
    except jobs.WaitTimedOut as exc:
        line.end()
        click.echo(f"Error: {exc}", err=True)
        return jobs.EXIT_WAIT_TIMED_OUT
    line.end()
    click.echo(f"job {job_id} {view.state}" + (f": {view.reason}" if view.reason else ""), err=True)
    return jobs.exit_code(view.state)
