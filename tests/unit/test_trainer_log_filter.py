"""Pod logs drop the c10d store-poll timeouts of in-process restart, and nothing else."""

from __future__ import annotations

import io
import os

import pytest
from rtj_trainer.log_filter import NoiseFilter

pytestmark = pytest.mark.unit

NOISE = (
    b"[W1130 10:00:01.123456 1234 socket.cpp:460] [c10d] waitForInput: socket "
    b"SocketImpl(fd=12, addr=[::ffff:10.0.0.7]:41234, remote=[::ffff:10.0.0.5]:29501) timed out after 50ms\n"
)
NOISE_POLL = (
    b"[rank0]:[W1130 23:03:08.416014998 socket.cpp:469] [c10d] waitForInput: poll for socket "
    b"SocketImpl(fd=44, addr=[localhost]:58516, remote=[localhost]:57181) returned 0, likely a timeout\n"
)
REAL = [
    b"[W1130 10:00:02.000000 1234 ProcessGroupNCCL.cpp:1000] Warning: a real NCCL warning\n",
    b"[c10d] waitForInput: poll for socket SocketImpl(fd=3) failed with res=-1, err=9.\n",
    b"Traceback (most recent call last):\n",
    b'  File "train.py", line 3, in <module>\n',
    b"RuntimeError: boom\n",
]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0  # one second per line read
        return self.now


def _run(lines: list[bytes], interval: float = 60.0) -> tuple[NoiseFilter, bytes]:
    r, w = os.pipe()
    with os.fdopen(w, "wb") as writer:
        writer.write(b"".join(lines))
    sink = io.BytesIO()
    with os.fdopen(r, "rb") as reader:
        f = NoiseFilter(reader, sink, summary_interval=interval, clock=FakeClock()).start()
        f.join(timeout=10)
    return f, sink.getvalue()


def test_store_poll_timeouts_are_dropped_and_counted_the_rest_passes_verbatim() -> None:
    f, out = _run([NOISE, REAL[0], NOISE_POLL, NOISE, *REAL[1:]])
    assert f.dropped == 3 and f.passed == len(REAL)
    kept = [line + b"\n" for line in out.split(b"\n") if line and not line.startswith(b"rtj-trainer:")]
    assert kept == REAL
    assert out.endswith(b"dropped 3 '[c10d] waitForInput ... timed out' lines "
                        b"(the store polls of NVRx in-process restart; harmless)\n")  # fmt: skip


def test_a_summary_at_most_once_per_interval() -> None:
    f, out = _run([NOISE] * 300, interval=60.0)  # 300 fake seconds
    summaries = [line for line in out.splitlines() if line.startswith(b"rtj-trainer: dropped")]
    assert f.dropped == 300
    assert 4 <= len(summaries) <= 6
    assert sum(int(s.split()[2]) for s in summaries) == 300


def test_no_summary_without_noise() -> None:
    _, out = _run(REAL)
    assert out == b"".join(REAL)
