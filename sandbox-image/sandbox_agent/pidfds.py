"""`pidfd_for(pid)`: an fd that turns readable once the process `pid` exited: a pidfd, or a stand-in where the
kernel has none.

The agent waits for every command through a pidfd (process.py, spawner.py). gVisor's kernel as Debian
ships it (runsc 2022) answers `pidfd_open` with ENOSYS, so there the fd is the read end of a pipe whose
write end one watcher thread closes when the process is a zombie or gone (it polls /proc/PID/stat, every
few milliseconds while something is watched). The read end is a real fd: it goes into the event loop and
across the spawner's socket like a pidfd. One difference: a helper that dies closes the pipes of the
commands it started, so their ends are seen early (the exit status is then unknown, as it already is
for such commands).
"""

from __future__ import annotations

import _thread
import errno
import os
import time

POLL_S = 0.003


class _Watcher:
    def __init__(self) -> None:
        # Imported here: the spawner helper imports this module and runs a watcher only under gVisor; threading
        # would cost every idle helper 0.2 MiB.
        import threading

        self._lock = threading.Condition()
        self._watched: dict[int, list[int]] = {}
        threading.Thread(target=self._run, name="pidfd-watcher", daemon=True).start()

    def watch(self, pid: int) -> int:
        state = _state(pid)
        if state is None:  # as pidfd_open: a zombie still has its pidfd, a reaped process has none
            raise ProcessLookupError(errno.ESRCH, f"no process {pid}")
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        if state in _ENDED:
            os.close(write_end)
            return read_end
        with self._lock:
            self._watched.setdefault(pid, []).append(write_end)
            self._lock.notify()
        return read_end

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._watched:
                    self._lock.wait()
                pids = list(self._watched)
            for pid in pids:
                if _ended(pid):
                    with self._lock:
                        ends = self._watched.pop(pid, [])
                    for end in ends:
                        os.close(end)
            time.sleep(POLL_S)


_ENDED = (b"Z", b"X")


def _state(pid: int) -> bytes | None:
    """The process's state letter (b"R", b"Z"...), None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def _ended(pid: int) -> bool:
    state = _state(pid)
    return state is None or state in _ENDED


_watcher: _Watcher | None = None
_watcher_lock = _thread.allocate_lock()


def pidfd_for(pid: int) -> int:
    """A pidfd for `pid`, or the stand-in above when the kernel has no pidfd_open; ProcessLookupError when
    `pid` does not exist."""
    global _watcher
    try:
        return os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
    with _watcher_lock:
        if _watcher is None:
            _watcher = _Watcher()
    return _watcher.watch(pid)
