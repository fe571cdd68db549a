"""What SLURM says about a job: `scontrol show job` (live and recently ended jobs), then `sacct` when the cluster keeps
accounting (a job long gone), never anything else. Every call is one short subprocess with a timeout; a cluster
that does not answer is None, not an exception."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

# SLURM job states (squeue/scontrol/sacct spell them the same) and what a run is then
WAITING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SUSPENDED",
           "REQUEUED_HOLD", "SPECIAL_EXIT", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}
RUNNING = {"RUNNING", "COMPLETING"}
# a job that left the queue: the run's status, and the words for it
ENDED = {
    "COMPLETED": ("finished", "the job completed"),
    "FAILED": ("failed", "the job failed"),
    "CANCELLED": ("cancelled", "the job was cancelled (scancel)"),
    "TIMEOUT": ("timeout", "the job reached its time limit"),
    "PREEMPTED": ("preempted", "the job was preempted by a job of higher priority"),
    "NODE_FAIL": ("node-failure", "a node of the job failed"),
    "BOOT_FAIL": ("node-failure", "a node of the job failed to boot"),
    "OUT_OF_MEMORY": ("failed", "the job ran out of memory (SLURM's limit)"),
    "DEADLINE": ("timeout", "the job reached its deadline"),
    "REVOKED": ("cancelled", "the job was revoked"),
}


@dataclass
class JobInfo:
    job_id: str
    state: str  # SLURM's JobState, e.g. RUNNING, PENDING, TIMEOUT
    reason: str = ""
    exit_code: int | None = None  # the batch script's
    signal: int | None = None
    restarts: int = 0
    nodes: str = ""  # the node list
    batch_host: str = ""
    time_limit: str = ""
    source: str = "scontrol"

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    @property
    def running(self) -> bool:
        return self.state in RUNNING

    @property
    def ended(self) -> bool:
        return not self.waiting and not self.running


def _run(argv: list[str], timeout: float = 20.0) -> subprocess.CompletedProcess[str] | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=dict(os.environ),
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o ID`: one line of Key=Value (a value may hold spaces only in its last fields, which we
    do not read)."""
    out: dict[str, str] = {}
    for word in text.split():
        key, eq, value = word.partition("=")
        if eq and key not in out:
            out[key] = value
    return out


def _exit(code: str) -> tuple[int | None, int | None]:
    """"ExitCode=0:15" -> (0, 15)."""
    a, _, b = (code or "").partition(":")
    try:
        return int(a), (int(b) if b else None)
    except ValueError:
        return None, None


def scontrol_job(job_id: str) -> JobInfo | None | bool:
    """The job as slurmctld knows it; False when slurmctld no longer knows it (ended more than MinJobAge ago);
    None when it could not be asked."""
    p = _run(["scontrol", "show", "job", "-o", str(job_id)])
    if p is None:
        return None
    if p.returncode != 0:
        return False if "Invalid job id" in (p.stderr + p.stdout) else None
    f = parse_scontrol(p.stdout)
    if "JobState" not in f:
        return None
    code, sig = _exit(f.get("ExitCode", ""))
    return JobInfo(str(job_id), f["JobState"], f.get("Reason", ""), code, sig, int(f.get("Restarts") or 0),
                   f.get("NodeList", ""), f.get("BatchHost", ""), f.get("TimeLimit", ""), "scontrol")


SACCT_FIELDS = "JobIDRaw,State,ExitCode,Reason,NodeList"  # fields sacct has (it has no restart count: see below)


def parse_sacct(text: str, job_id: str) -> JobInfo | None:
    """`sacct -j ID -X -n -P -D -o JobIDRaw,State,ExitCode,Reason,NodeList`: one row per allocation of the job
    (--duplicates), oldest first: the last is how it ended, the rows before it the times it was requeued."""
    rows = [line.split("|") for line in text.splitlines() if line.strip()]
    rows = [r for r in rows if r and r[0] == str(job_id)]
    if not rows:
        return None
    r = rows[-1] + [""] * 5
    state = r[1].split()[0] if r[1] else ""  # "CANCELLED by 0"
    code, sig = _exit(r[2])
    return JobInfo(str(job_id), state, r[3], code, sig, len(rows) - 1, r[4], "", "", "sacct")


def sacct_job(job_id: str) -> JobInfo | None:
    """The job from the accounting database; None when the cluster keeps none (sacct: "accounting storage is
    disabled") or it cannot be asked."""
    p = _run(["sacct", "-j", str(job_id), "-X", "-n", "-P", "-D", "-o", SACCT_FIELDS])
    if p is None or p.returncode != 0:
        return None
    return parse_sacct(p.stdout, job_id)


def job_info(job_id: str) -> JobInfo | None | bool:
    """scontrol, then sacct for a job slurmctld forgot. False: nobody knows the job any more."""
    info = scontrol_job(job_id)
    if info is False:
        acct = sacct_job(job_id)
        return acct if acct is not None else False
    return info


def submit(script: str, env: dict[str, str], cwd: str) -> str:
    """`sbatch --parsable SCRIPT`; the job id, or RuntimeError with what sbatch said."""
    if shutil.which("sbatch") is None:
        raise RuntimeError("sbatch is not on PATH: this machine is not a SLURM login node (or the SLURM client "
                           "commands are not installed)")
    try:
        p = subprocess.run(["sbatch", "--parsable", script], capture_output=True, text=True, timeout=120, env=env,
                           cwd=cwd, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RuntimeError("sbatch did not answer in 120 s (slurmctld unreachable?)") from None
    if p.returncode != 0:
        raise RuntimeError((p.stderr or p.stdout).strip() or f"sbatch exited {p.returncode}")
    return p.stdout.strip().split(";")[0]


def scancel(job_id: str, *args: str) -> str | None:
    """scancel; None when it worked, else what it said."""
    p = _run(["scancel", *args, str(job_id)], timeout=30)
    if p is None:
        return "scancel is not on PATH"
    return None if p.returncode == 0 else (p.stderr or p.stdout).strip()


def allocation_nodes() -> list[str]:
    """Inside a job: its nodes, in order (the first is where the batch script runs)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST") or ""
    if not nodelist:
        return []
    p = _run(["scontrol", "show", "hostnames", nodelist])
    if p is None or p.returncode != 0:
        return [nodelist]
    return p.stdout.split()
