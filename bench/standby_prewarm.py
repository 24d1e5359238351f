"""What a hot spare's pre-warm saves: promotion -> ft_launcher running, cold vs pre-warmed.

    .venv/bin/python bench/standby_prewarm.py [--repeat 3]

Cold (baseline): `python -m <ft_launcher> --help`, start to exit, as a replacement pod's launcher
starts. Warm: `python -m rtj_trainer.warm_launcher --help` is started and left to pre-warm (torch,
the launcher, the example training module); the clock runs from the `go` line (the promotion) to
exit. `--help` makes the launcher parse its arguments and stop: what is timed is getting the
launcher running, not the rendezvous or the ranks (those are in bench/recovery_cluster.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from rtj_trainer.warm_launcher import ENV_PREWARM_MODULE, GO, LAUNCHER_MODULE

TRAIN_MODULE = "rtj_trainer.examples.fsdp_train"


def cold() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", LAUNCHER_MODULE, "--help"], capture_output=True, check=True)
    return time.perf_counter() - t0


def warm() -> tuple[float, float]:
    """(pre-warm seconds, go -> exit seconds)."""
    env = {**os.environ, ENV_PREWARM_MODULE: TRAIN_MODULE}
    t_start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rtj_trainer.warm_launcher", "--help"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stderr is not None
    for line in proc.stderr:  # until it says it is warm
        if b"pre-warmed" in line:
            break
    prewarm = time.perf_counter() - t_start
    t0 = time.perf_counter()
    proc.stdin.write(f"{GO}\n".encode())
    proc.stdin.close()
    proc.stderr.read()
    rc = proc.wait()
    assert rc == 0, rc
    return prewarm, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    colds, warms, prewarms = [], [], []
    for _ in range(args.repeat):  # interleaved, so both see the same load
        colds.append(cold())
        p, w = warm()
        prewarms.append(p)
        warms.append(w)
    end_load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} cores, load average {load} (start) | {end_load} (end), n={args.repeat}")
    print("| promotion -> ft_launcher running | min s | median s |")
    print("|---|---|---|")
    print(f"| cold start (baseline) | {min(colds):.2f} | {statistics.median(colds):.2f} |")
    print(f"| pre-warmed hot spare | {min(warms):.2f} | {statistics.median(warms):.2f} |")
    print(f"| (pre-warm, off the critical path) | {min(prewarms):.2f} | {statistics.median(prewarms):.2f} |")
    print(f"ratio warm/cold (median): {statistics.median(warms) / statistics.median(colds):.2f}")


if __name__ == "__main__":
    main()
