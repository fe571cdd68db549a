"""`rlctl status` with 10 runs on 3 SSH hosts, on loopback (a real sshd, tests/remote_sshd.py): the wall time of
the whole command, cold (no shared connection yet) and warm (ControlMaster up). Target: <= 1.5 s.

    python bench/remote_status.py            # prints the figures; needs root (the test sshd) and openssh-server

Each host answers one round trip (python -m rlctl.executors.ssh_remote poll) for all its runs; hosts are asked in
parallel threads. The runs are finished runs with a short metrics stream (no training here: the figure is rlctl's).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from tests.remote_sshd import ALIAS, ensure_openssh, make_sshd

    why = ensure_openssh()
    if why or os.geteuid() != 0:
        sys.exit(f"skip: {why or 'needs root (the test sshd logs in as root)'}")
    tmp = Path(tempfile.mkdtemp(prefix="rlctl-bench-"))
    sshd = make_sshd(tmp / "sshd")
    sshd.start()
    ctl = Path(tempfile.mkdtemp(prefix="rb-", dir="/tmp"))
    env = dict(os.environ, RLCTL_CONFIG_DIR=str(tmp / "config"), RLCTL_SSH_CONFIG=str(sshd.client_config),
               RLCTL_SSH_CONTROL_DIR=str(ctl), RLCTL_RUNS_DIR=str(tmp / "laptop-runs"), PYTHONPATH=str(ROOT))

    def rlctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rlctl.cli", *args], env=env, capture_output=True, text=True,
                              timeout=120)

    try:
        n = 0
        for h in range(3):
            work = tmp / f"remote{h}"
            rlctl("hosts", "add", f"box{h}", ALIAS, "--workdir", str(work), "--python", sys.executable,
                  "--env", f"PYTHONPATH={ROOT}")
            for _ in range(4 if h == 0 else 3):
                n += 1
                name = f"run{n}-20260101-000000"
                rd = work / "runs" / name
                rd.mkdir(parents=True)
                now = time.time()
                (rd / "state.json").write_text(json.dumps({
                    "name": name, "status": "finished", "backend": "trl", "executor": "local", "total_steps": 20,
                    "started_at": now - 100, "ended_at": now, "exit_code": 0}))
                (rd / "metrics.jsonl").write_text("".join(
                    json.dumps({"step": s, "reward/mean": s / 20, "time": now - 100 + s}) + "\n" for s in range(1, 21)))
                (rd / "stdout.log").write_text("")
                local = tmp / "laptop-runs" / name
                local.mkdir(parents=True)
                (local / "state.json").write_text(json.dumps({
                    "name": name, "status": "running", "executor": "ssh", "host": f"box{h}", "backend": "trl",
                    "started_at": now - 100,
                    "handle": {"executor": "ssh", "ref": {"host": f"box{h}", "run_dir": str(rd)}}}))
        import resource

        times, cpus = [], []
        for i in range(6):
            if i == 0:
                subprocess.run(["ssh", "-F", str(sshd.client_config), "-o", f"ControlPath={ctl}/%C", "-O", "exit",
                                ALIAS], capture_output=True)
            t0 = time.perf_counter()
            c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            p = rlctl("status", "--timeout", "30")
            times.append(time.perf_counter() - t0)
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
            if p.returncode != 0 or p.stdout.count("finished") != 10:
                why = json.loads((tmp / "laptop-runs" / "run1-20260101-000000" / "state.json").read_text())
                sys.exit(f"not every run answered:\n{p.stdout}{p.stderr}\nrun1: {why.get('unreachable')}")
        print(p.stdout)
        print(f"rlctl status, 10 runs on 3 hosts (loopback sshd): cold {times[0]:.2f} s, warm median "
              f"{statistics.median(times[1:]):.2f} s (min {min(times[1:]):.2f} s); target <= 1.5 s\n"
              f"CPU time of the local side (rlctl + its ssh clients): warm median {statistics.median(cpus[1:]):.2f} s")
        t0 = time.perf_counter()
        rlctl("--help")
        print(f"(for scale: `rlctl --help` alone takes {time.perf_counter() - t0:.2f} s on this machine; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    finally:
        sshd.stop()
        subprocess.run(["ssh", "-F", str(sshd.client_config), "-o", f"ControlPath={ctl}/%C", "-O", "exit", ALIAS],
                       capture_output=True)


if __name__ == "__main__":
    main()
