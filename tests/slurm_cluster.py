"""A real SLURM cluster on this machine, standing in for a lab's cluster (one per test session).

Debian's slurm-wlm, munge, slurmdbd and mariadb-server (installed here as root when missing, as .ci/run does):
`munged`, `slurmctld` and two `slurmd` (nodes n1 and n2) as plain processes under a temp dir, with a small slurm.conf
(proctrack/linuxproc, no task plugin, no cgroups, cons_tres on CPUs), and accounting as a lab keeps it: `slurmdbd`
on a MariaDB server of its own (a fresh data directory, started as a plain process: about 10 s of the session), so
`sacct` answers for a job slurmctld has forgotten. slurmctld keeps an ended job MinJobAge = 600 s, so every test
but the one that makes it forget (`forget_jobs`) reads job states from squeue/scontrol, as on a cluster without
accounting. Each slurmd lives in its own network namespace joined by a bridge (a
node of its own address, as on a real cluster; Debian's slurmd cannot run twice on one address) and its own hostname
(n1, n2) that resolves to that address on every node (/etc/hosts of the node's mount namespace), as a cluster's DNS
does: what torchrun's rendezvous and gloo look up. The filesystem is shared, as between a login node and compute
nodes. Partitions: `debug` (default, jobs there are requeued when
preempted) and `urgent` (preempts `debug`), `cancel` (jobs there are cancelled when preempted). `private/` under the
cluster's directory is hidden from the nodes (a tmpfs over it in their mount namespace): a disk that is not shared.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge", "slurmdbd", "mariadb-server")
NODES = ("n1", "n2")


def ensure_slurm() -> str | None:
    """None when slurmctld, slurmd, munged and the client commands are there (installed as root if needed), else
    why not."""
    need = ["/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/sbin/slurmdbd", "/usr/sbin/mariadbd",
            "mariadb-install-db", "sbatch", "squeue", "scontrol", "sacct", "sacctmgr"]
    if all(shutil.which(x) or Path(x).exists() for x in need):
        return None
    if os.geteuid() != 0:
        return "slurm-wlm/munge missing and not root (apt-get install -y slurm-wlm munge)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    p = subprocess.run(["apt-get", "install", "-y", "-qq", *PACKAGES], capture_output=True, text=True, timeout=900,
                       env=env)
    if p.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=600)
        p = subprocess.run(["apt-get", "install", "-y", "-qq", *PACKAGES], capture_output=True, text=True,
                           timeout=900, env=env)
    if p.returncode != 0:
        return f"apt-get install {' '.join(PACKAGES)} failed: {p.stderr[-300:]}"
    return None


def _subnet() -> tuple[str, str]:
    """(bridge name, a /24 prefix "10.a.b") that no route of this machine uses yet."""
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    while True:
        prefix = f"10.{random.randint(180, 250)}.{random.randint(1, 254)}"
        if f"{prefix}." not in routes:
            return f"rlsl{random.randint(0, 99999)}", prefix


@dataclass
class SlurmCluster:
    root: Path
    nodes: tuple[str, ...] = NODES
    bridge: str = ""
    prefix: str = ""
    ctl_port: int = 0
    db_port: int = 0
    dbd_port: int = 0
    first_job_id: int = 1
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    netns: dict[str, str] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a user's shell on the login node has: the cluster's config (a real login node has it in
        /etc/slurm; here SLURM_CONF)."""
        return {"SLURM_CONF": str(self.conf)}

    def addr(self, node: str) -> str:
        return f"{self.prefix}.{2 + self.nodes.index(node)}"

    # ---- setup -----------------------------------------------------------------------------------------------------
    def _net(self) -> None:
        self.bridge, self.prefix = _subnet()
        run = _run
        run(["ip", "link", "add", self.bridge, "type", "bridge"])
        run(["ip", "addr", "add", f"{self.prefix}.1/24", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])
        for node in self.nodes:
            ns = f"{self.bridge}-{node}"
            run(["ip", "netns", "add", ns])
            self.netns[node] = ns
            host_end, ns_end = f"{self.bridge}{node}h", f"{self.bridge}{node}n"
            run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end])
            run(["ip", "link", "set", host_end, "master", self.bridge])
            run(["ip", "link", "set", host_end, "up"])
            run(["ip", "link", "set", ns_end, "netns", ns])
            run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"])
            run(["ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.addr(node)}/24", "dev", ns_end])
            run(["ip", "netns", "exec", ns, "ip", "link", "set", ns_end, "up"])

    def _write_conf(self) -> None:
        r = self.root
        node_lines = "\n".join(f"NodeName={n} NodeAddr={self.addr(n)} NodeHostname={n} CPUs=2 RealMemory=2000 "
                               "State=UNKNOWN" for n in self.nodes)
        nodes = ",".join(self.nodes)
        self.conf.write_text(f"""\
ClusterName=rlctltest
SlurmctldHost={socket.gethostname().split(".")[0]}({self.prefix}.1)
MailProg=/bin/true
SlurmctldPort={self.ctl_port}
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=600
JobRequeue=0
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
FirstJobId={self.first_job_id}
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={self.dbd_port}
AccountingStoragePass={r}/munge/munge.socket
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
{node_lines}
PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE
PartitionName=cancel Nodes={nodes} MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL
PartitionName=urgent Nodes={nodes} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
""")

    def _spawn(self, name: str, argv: list[str], netns: str | None = None) -> None:
        if netns:
            # only the network namespace: `ip netns exec` would also remount /sys, hiding the cgroup tree slurmd
            # looks for (it needs one mounted even when no cgroup plugin is configured)
            argv = ["nsenter", f"--net=/run/netns/{netns}", "--", *argv]
        log = open(self.root / f"{name}.out", "ab")  # noqa: SIM115 - lives as long as the daemon
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, env=env)

    def _accounting(self, timeout: float) -> None:
        """MariaDB (a fresh data directory, TCP on loopback only) and slurmdbd on it; the cluster registered."""
        r = self.root
        db = r / "db"
        p = subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={db}", "--user=root",
                            "--auth-root-authentication-method=normal", "--skip-test-db"],
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"mariadb-install-db: {(p.stderr or p.stdout)[-500:]}")
        (r / "db-init.sql").write_text("CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';\n"
                                       "GRANT ALL ON *.* TO 'slurm'@'127.0.0.1';\n")
        self._spawn("mariadbd", ["/usr/sbin/mariadbd", "--no-defaults", f"--datadir={db}", "--user=root",
                                 f"--port={self.db_port}", "--bind-address=127.0.0.1", f"--socket={r}/db.sock",
                                 f"--pid-file={r}/db.pid", f"--init-file={r}/db-init.sql", "--skip-name-resolve",
                                 "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0",
                                 f"--log-error={r}/mariadbd.log"])
        self._wait(lambda: _listening(self.db_port), timeout, "mariadbd did not listen")
        dbd = r / "slurmdbd.conf"  # beside slurm.conf: where slurmdbd looks; 0600, as it insists
        dbd.write_text(f"""\
AuthType=auth/munge
AuthInfo=socket={r}/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={self.dbd_port}
SlurmUser=root
LogFile={r}/slurmdbd.log
PidFile={r}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.db_port}
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct
""")
        os.chmod(dbd, 0o600)
        self._spawn("slurmdbd", ["/usr/sbin/slurmdbd", "-D"])
        self._wait(lambda: _listening(self.dbd_port), timeout, "slurmdbd did not listen")
        p = subprocess.run(["sacctmgr", "-i", "add", "cluster", "rlctltest"], capture_output=True, text=True,
                           timeout=60, env={**os.environ, **self.env})
        if p.returncode != 0 and "already exists" not in p.stdout + p.stderr:
            raise RuntimeError(f"sacctmgr add cluster: {(p.stderr or p.stdout)[-500:]}")

    def _slurmctld(self, *flags: str, timeout: float = 60.0) -> None:
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", *flags, "-f", str(self.conf)])
        self._wait(lambda: self.scontrol("ping").returncode == 0, timeout, "slurmctld did not answer")

    def start(self, timeout: float = 60.0) -> None:
        r = self.root
        for d in ("munge", "state", "spool"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o755)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        with socket_free() as port:
            self.ctl_port = port
        with socket_free() as port:
            self.db_port = port
        with socket_free() as port:
            self.dbd_port = port
        self._net()
        self._write_conf()
        self._spawn("munged", ["/usr/sbin/munged", "-F", "--force", f"--key-file={key}",
                               f"--socket={r}/munge/munge.socket", f"--pid-file={r}/munge/munged.pid",
                               f"--log-file={r}/munge/munged.log", f"--seed-file={r}/munge/munged.seed"])
        self._wait(lambda: (r / "munge" / "munge.socket").exists(), 20, "munged did not create its socket")
        self._accounting(timeout)
        self._slurmctld(timeout=timeout)
        for node in self.nodes:
            (r / "spool" / node).mkdir(parents=True, exist_ok=True)
            # a mount namespace of its own where `private/` is an empty tmpfs: a directory the login node has and
            # the compute nodes do not (the run directory on a disk that is not shared)
            (r / "private").mkdir(exist_ok=True)
            # and a hostname of its own (UTS namespace) that every node resolves to its address
            hosts = r / f"hosts-{node}"
            hosts.write_text(Path("/etc/hosts").read_text() + "".join(f"{self.addr(n)} {n}\n" for n in self.nodes))
            slurmd = f"exec /usr/sbin/slurmd -D -N {node} -f {self.conf}"
            self._spawn(f"slurmd-{node}", ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c",
                                           f"mount -t tmpfs tmpfs {r / 'private'} && mount --bind {hosts} /etc/hosts "
                                           f"&& hostname {node} && {slurmd}"],
                        netns=self.netns[node])
        self._wait(self.all_idle, timeout, "the nodes did not come up idle")

    def _wait(self, cond, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if cond():
                return
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited ({p.returncode}): {self.logs()}")
            time.sleep(0.2)
        raise RuntimeError(f"{what} in {timeout:.0f} s: {self.logs()}")

    def logs(self) -> str:
        out = []
        for p in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            with contextlib.suppress(OSError):
                out.append(f"--- {p.name}\n" + p.read_text(errors="replace")[-1500:])
        return "\n".join(out)

    # ---- questions -------------------------------------------------------------------------------------------------
    def scontrol(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30,
                              env={**os.environ, **self.env})

    def node_states(self) -> dict[str, str]:
        p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30,
                           env={**os.environ, **self.env})
        return dict(line.split() for line in p.stdout.splitlines() if len(line.split()) == 2)

    def all_idle(self) -> bool:
        st = self.node_states()
        return all(st.get(n, "").rstrip("*") in ("idle", "mixed", "allocated") for n in self.nodes)

    def resume_node(self, node: str) -> None:
        """A node set down (a failed node) back in service, and idle."""
        self.scontrol("update", f"nodename={node}", "state=resume")
        self._wait(lambda: self.node_states().get(node, "").rstrip("*") in ("idle", "mixed"), 60,
                   f"{node} did not return to service")

    def forget_jobs(self) -> None:
        """slurmctld restarted with its state cleared: it no longer knows any job, as it forgets an ended one
        MinJobAge seconds after its end (here at once, not after the minutes a test cannot wait); only slurmdbd
        still does. New job ids go on above the old ones. Jobs still queued or running are cancelled first."""
        p = self.scontrol("show", "config")
        nxt = next((line.split("=", 1)[1].strip() for line in p.stdout.splitlines()
                    if line.split("=", 1)[0].strip() == "NEXT_JOB_ID"), "")
        self.cancel_all()
        self.first_job_id = int(nxt) + 100 if nxt.isdigit() else self.first_job_id + 100000
        ctld = self.procs.pop("slurmctld")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(ctld.pid, signal.SIGTERM)
        ctld.wait(timeout=30)
        self._write_conf()
        self._slurmctld("-c")
        self._wait(self.all_idle, 60, "the nodes did not come back idle")

    def cancel_all(self) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, timeout=30,
                       env={**os.environ, **self.env})

    # ---- teardown --------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.cancel_all()
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        for ns in self.netns.values():
            # processes a job left behind in a node's namespace (slurmstepd, ray) go with the node
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        if self.bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _run(argv: list[str]) -> None:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip()}")


@contextlib.contextmanager
def socket_free():
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    port = s.getsockname()[1]
    s.close()
    yield port


def start_cluster() -> SlurmCluster:
    root = Path(tempfile.mkdtemp(prefix="rlctl-slurm-", dir="/tmp"))
    os.chmod(root, 0o755)
    c = SlurmCluster(root)
    try:
        c.start()
    except BaseException:
        c.stop()
        raise
    return c


if __name__ == "__main__":  # python tests/slurm_cluster.py: start one, print its config, wait for Ctrl-C or SIGTERM
    import sys

    c = start_cluster()
    print(f"export SLURM_CONF={c.conf}", flush=True)
    # SIGTERM stops it too (and SIGINT where a shell started it in the background, with SIGINT ignored)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    try:
        signal.pause()
    finally:
        c.stop()
