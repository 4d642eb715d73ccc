"""Child processes that never outlive the process that started them.

The local broker runs Kafka's JVMs as child processes. If the harness dies without running its clean-up
(SIGKILL, an out-of-memory kill, a crash in native code), those children would keep their ports and memory
forever. A parent-death signal (``PR_SET_PDEATHSIG``) is not enough: it fires when the *thread* that started
the child exits, so a broker restarted from a drill's thread would die with that thread.

Instead each ``ProcessGroup`` starts a tiny watchdog process that leads a new process group and reads a pipe
from us. Every child joins that group. The pipe reaches end-of-file only when we close it or die, whichever
comes first; the watchdog then kills the whole group, itself included. The group id stays valid as long as the
watchdog lives, so no unrelated process that reuses a child's pid can be hit.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

# Runs in the watchdog: wait for end-of-file on stdin, then SIGKILL the group (stopped members too).
_WATCHDOG = "import os, signal\nwhile os.read(0, 64):\n    pass\nos.killpg(0, signal.SIGKILL)\n"


class ProcessGroup:
    """A process group whose members are killed when it is closed or when this process dies.

    Its members are in a process group of their own, so a Ctrl-C at the terminal reaches only this process,
    which then stops them in order.
    """

    def __init__(self) -> None:
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            process_group=0,
        )

    @property
    def pgid(self) -> int:
        """The id of the group (the watchdog's pid)."""
        return self._watchdog.pid

    def spawn(
        self, args: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``args`` in the group with exactly ``env`` (in ``cwd``), its output appended to ``log_path``."""
        with open(log_path, "ab") as out:
            return subprocess.Popen(
                list(args),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                cwd=cwd,
                process_group=self.pgid,
            )

    def close(self) -> None:
        """Kill whatever is left in the group and wait for the watchdog to exit."""
        if self._watchdog.stdin is not None and not self._watchdog.stdin.closed:
            self._watchdog.stdin.close()
        self._watchdog.wait()


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 5.0, kill: bool = False) -> None:
    """Stop and reap ``proc``: SIGTERM, then SIGKILL after ``grace_s`` seconds (at once if ``kill``)."""
    if proc.poll() is not None:
        return
    if kill:
        proc.kill()
    else:
        proc.terminate()
        try:
            proc.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


#: The exit code of a command stopped at its time limit, as ``timeout(1)`` exits.
TIMED_OUT = 124


def run_limited(
    args: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    limit_s: float,
    grace_s: float,
    cwd: Path | None = None,
) -> int:
    """Run ``args`` in a process group of its own, output appended to ``log_path``; its exit code.

    Past ``limit_s`` the command is stopped (SIGTERM, then SIGKILL after ``grace_s``) and ``TIMED_OUT`` is
    returned; a Ctrl-C or any other error stops it the same way before going on up. Whatever it started goes
    with its group.
    """
    group = ProcessGroup()
    try:
        process = group.spawn(args, env, log_path, cwd=cwd)
        try:
            return process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            stop_process(process, grace_s)
            return TIMED_OUT
        except BaseException:
            stop_process(process, grace_s)
            raise
    finally:
        group.close()


def wait_stopped(pid: int, timeout: float = 5.0) -> bool:
    """Wait until every thread of ``pid`` is stopped (after SIGSTOP); False if some still ran at ``timeout``.

    SIGSTOP reaches each thread of a process on its own: a JVM's hundred threads can still answer a request
    for a moment after the signal was sent, so an incident that freezes a broker waits for all of them.
    A process that is gone counts as stopped.
    """
    tasks = Path(f"/proc/{pid}/task")
    deadline = time.monotonic() + timeout
    while True:
        try:
            states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if all(s in ("T", "t", "Z", "X") for s in states):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
