"""Following a job from the command line (`submit -f`, `logs -f`, `wait`): its status line, its output, and the
exit code its outcome gives."""

from __future__ import annotations

import shutil
import sys
from typing import TYPE_CHECKING, TextIO

import click

from jobplane.model.states import State
from jobplane.views.jobview import Status

if TYPE_CHECKING:
    from jobplane import sdk

# What `logs -f`, `submit -f` and `wait` exit with: 0 only for SUCCEEDED (or a job that reached RUNNING, for
# `wait --for running`), one code per other ending so a script can tell them apart.
EXIT_CODES = {State.SUCCEEDED: 0, State.FAILED: 1, State.CANCELLED: 3, State.TIMED_OUT: 4, State.STALLED: 5,
              State.INVALID: 6}
EXIT_WAIT_TIMED_OUT = 124  # as GNU timeout(1)
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT


def exit_code(state: State) -> int:
    """0 for SUCCEEDED (and for a live job: the goal was RUNNING), else the ending's own code."""
    return EXIT_CODES.get(state, 0)


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


def follow_job(client: sdk.Client, job_id: str, goal: str, *, interval: float, timeout: float | None = None,
               logs: bool = False, attempt: int | None = None, rank: int | None = None) -> int:
    """Follow a job to goal ("running" or "terminal") with a status line (and its output with logs, to the end);
    return the exit code to use.

    Ctrl-C stops following, never the job."""
    from jobplane import sdk  # loaded by a command that runs, not by --help

    line = StatusLine()
    try:
        job = client.get(job_id)  # a job that does not exist is an error at once
        if logs:
            many_nodes = job.view.num_nodes > 1 and rank is None
            reran = attempt is None and job.view.attempt > 1
            for text in job.logs(follow=True, attempt=attempt, rank=rank, interval=interval, timeout=timeout,
                                 on_status=line.show):
                tag = many_nodes or (attempt is None and (reran or text.attempt > 1))
                line.above(tagged(text) if tag else text + "\n")
        else:
            job.wait(timeout, "running" if goal == "running" else "terminal", interval=interval, on_status=line.show)
    except KeyboardInterrupt:
        line.end()
        click.echo(f"stopped following {job_id}; the job goes on (`jobplane cancel {job_id}` stops it)", err=True)
        return EXIT_INTERRUPTED
    except sdk.Timeout as exc:
        line.end()
        click.echo(f"Error: {exc}", err=True)
        return EXIT_WAIT_TIMED_OUT
    line.end()
    view = job.view
    click.echo(f"job {job_id} {view.state}" + (f": {view.reason}" if view.reason else ""), err=True)
    return exit_code(view.state)


def tagged(line: sdk.LogLine) -> str:
    """The line prefixed [attempt/rank] (each part of it a terminal shows as a line), for jobs with several nodes
    or attempts."""
    return "".join(f"[{line.attempt}/{line.rank}] {part}" for part in (line + "\n").splitlines(keepends=True))
