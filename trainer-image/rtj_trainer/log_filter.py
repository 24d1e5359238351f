"""Readable pod logs: the launcher's and ranks' stderr pass through here, minus known noise.

NVRx's in-process restart polls the c10d store with 50 ms timeouts, and every poll that times out makes
torch log it twice (`[c10d] waitForInput: poll for socket ... returned 0, likely a timeout` and
`[c10d] waitForInput: socket ... timed out after 50ms`): ~3,100 lines a minute on a 2-rank H200 run.
Those lines, and only those, are dropped; once a minute at most, one line says how many were.
Everything else, real warnings and tracebacks included, is passed on unchanged. This runs in the pod's
main process, which outlives the processes it reads from and drains the pipe before it exits.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import IO

# The one kind of line dropped is STORE_POLL_TIMEOUT: a store poll that timed out, in both forms torch's
# c10d socket code logs it (nvrx_patches keeps the upstream text we rely on, under its canary).
from .nvrx_patches import STORE_POLL_TIMEOUT

SUMMARY_INTERVAL_SECONDS = 60.0


class NoiseFilter:
    """Copies lines from `source` to `sink`, dropping those that match `noise`."""

    def __init__(
        self,
        source: IO[bytes],
        sink: IO[bytes],
        noise: re.Pattern[bytes] = STORE_POLL_TIMEOUT,
        summary_interval: float = SUMMARY_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        observe: Callable[[bytes], None] | None = None,
    ) -> None:
        self._source, self._sink, self._noise = source, sink, noise
        #: Sees every line passed on (e.g. rendezvous_loss.LostStoreWatch).
        self._observe = observe
        self._interval, self._clock = summary_interval, clock
        self.passed = 0
        self.dropped = 0
        self._unreported = 0
        self._last_summary = clock()
        self._thread = threading.Thread(target=self.run, name="rtj-log-filter", daemon=True)

    def start(self) -> NoiseFilter:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        """Wait for the source's end of file (every writer gone); then report what was dropped."""
        self._thread.join(timeout)

    def run(self) -> None:
        for line in iter(self._source.readline, b""):
            if self._noise.search(line):
                self.dropped += 1
                self._unreported += 1
            else:
                self.passed += 1
                self._write(line)
                if self._observe is not None:
                    self._observe(line)
            if self._unreported and self._clock() - self._last_summary >= self._interval:
                self._summarize()
        if self._unreported:
            self._summarize()

    def _summarize(self) -> None:
        self._write(
            f"rtj-trainer: dropped {self._unreported} '[c10d] waitForInput ... timed out' lines "
            f"(the store polls of NVRx in-process restart; harmless)\n".encode()
        )
        self._unreported = 0
        self._last_summary = self._clock()

    def _write(self, data: bytes) -> None:
        try:
            self._sink.write(data)
            self._sink.flush()
        except (OSError, ValueError):  # the pod's stderr is gone: nothing left to tell
            pass
