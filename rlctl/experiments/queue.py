"""The experiment queue: a detached process (`python -m rlctl.experiments.queue EXP_DIR`, in its own session, like
the run supervisor) that starts variants as capacity frees up, each as an ordinary detached run with its own
supervisor (which applies the run's restart policy), and survives the rlctl that started it.

Capacity is a list of *slots*: where a run may go and what it holds there. On this machine a slot holds GPU indices
(CUDA_VISIBLE_DEVICES: no two runs on the same GPUs, each with the count its recipe asks for) or, for CPU recipes,
just a place (`--parallel N` of them); on a Ray cluster a slot is a job the cluster places; with `--on HOST,...`
a slot is a host (the SSH executor's). A failed variant never blocks the rest: its slot frees up when its run ends,
however it ended. With several hosts each run is a pool run of them: the queue follows it by the same rule as `rlctl
watch` (rlctl.runs.failover), so a run whose host is gone moves to a free place on another host.

Restartable: the queue's record (queue.json) says which variant has which run directory; a queue started again
(`rlctl experiment resume`, after kill -9 or a reboot) adopts live runs, resumes interrupted ones through their own
supervisor (`rlctl resume`), launches only what never started, and finishes what more seeds added. A lock file held
for the process's life keeps a second queue out.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError, Unreachable
from rlctl.experiments.manifest import LOG, QUEUE, queue_alive, read_json, read_manifest, read_queue, write_json

LOCK = "queue.lock"
TICK = 1.0
DONE = ("done", "launch-failed")
# how long a run's host may stay unreachable before its variant is settled as "unreachable" (the queue then ends
# instead of waiting forever; `experiment resume` asks again)
UNREACHABLE_S = float(os.environ.get("RLCTL_EXP_UNREACHABLE_S", "1800"))
RETRY_S = float(os.environ.get("RLCTL_EXP_RETRY_S", "30"))  # a down host with no run to ask: one launch try per


@dataclass
class Slot:
    """A place one run can go: a host (None = this machine) and the GPU indices it holds there."""

    name: str
    host: str | None = None
    gpus: tuple[int, ...] = ()
    busy: str | None = None  # the variant in it
    index: int = 0  # which of the host's `parallel` places

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "host": self.host, "gpus": list(self.gpus), "index": self.index}


@dataclass
class Capacity:
    """The slots of one experiment, built from its placement record."""

    placement: dict[str, Any]
    gpu_ids: list[int] = field(default_factory=list)
    # variant -> (host, gpus, index of the place on the host)
    used: dict[str, tuple[str | None, tuple[int, ...], int]] = field(default_factory=dict)

    @classmethod
    def from_placement(cls, placement: dict[str, Any]) -> Capacity:
        return cls(placement, list(placement.get("gpu_ids") or []))

    def take(self, variant: str, gpus_needed: int, need_gib: float | None = None,
             free_gib: dict[int, float] | None = None, down: set[str | None] | None = None) -> Slot | None:
        """A slot for a variant needing `gpus_needed` GPUs on one machine, each with `need_gib` free (its memory
        plan; `free_gib` is what each local GPU has free now), or None while no such slot is open. Hosts in `down`
        (a run there does not answer) get nothing new."""
        parallel = int(self.placement.get("parallel") or 1)
        hosts: list[str | None] = list(self.placement.get("hosts") or [None])
        for host in hosts:
            if down and host in down:
                continue
            on_host = [u for u in self.used.values() if u[0] == host]
            places = sorted(set(range(parallel)) - {u[2] for u in on_host})
            if not places:
                continue
            gpus: tuple[int, ...] = ()
            # the CLI records `executor: None` when --executor is not given: that is this machine too
            local = (self.placement.get("executor") or "local") == "local"
            if gpus_needed and host is None and local and self.gpu_ids:
                taken = {g for _, gs, _ in on_host for g in gs}
                free = [g for g in self.gpu_ids if g not in taken]
                if need_gib and free_gib:  # another process may hold memory on a GPU no run of ours uses
                    free = [g for g in free if free_gib.get(g, float("inf")) >= need_gib]
                if len(free) < gpus_needed:
                    continue
                gpus = tuple(free[:gpus_needed])
            self.used[variant] = (host, gpus, places[0])
            name = (host or "local") + (f":gpu{','.join(map(str, gpus))}" if gpus else f"#{places[0]}")
            return Slot(name, host, gpus, variant, places[0])
        return None

    def hold(self, variant: str, slot: dict[str, Any] | None) -> None:
        slot = slot or {}
        self.used[variant] = (slot.get("host"), tuple(slot.get("gpus") or ()), int(slot.get("index") or 0))

    def free(self, variant: str) -> None:
        self.used.pop(variant, None)


@contextlib.contextmanager
def visible_gpus(gpus: tuple[int, ...]):
    """The environment a run launched in this block inherits: CUDA_VISIBLE_DEVICES = the slot's GPU indices, and
    CUDA_DEVICE_ORDER = PCI_BUS_ID, since the indices are nvidia-smi's (PCI bus order) and CUDA's default order
    (fastest first) can name another GPU by the same index on a machine of mixed GPUs. Restored afterwards."""
    if not gpus:
        yield
        return
    from rlctl.core.environ import environ

    with environ(CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)), CUDA_DEVICE_ORDER="PCI_BUS_ID"):
        yield


def local_gpu_ids() -> list[int]:
    """The GPU indices this machine offers: CUDA_VISIBLE_DEVICES when set (numeric), else nvidia-smi's."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        ids = [x.strip() for x in vis.split(",") if x.strip()]
        return [int(x) for x in ids if x.isdigit()]
    from rlctl.runs.rundir import gpus

    return [int(g["index"]) for g in gpus() if str(g.get("index", "")).isdigit()]


def local_gpu_free_gib() -> dict[int, float] | None:
    """Free memory of each local GPU now (nvidia-smi), in GiB; None where it cannot be read."""
    from rlctl.core.gpus import smi_rows

    out = {r["index"]: r["memory_free_gib"] for r in smi_rows() or [] if r["memory_free_gib"] is not None}
    return out or None


class Queue:
    def __init__(self, d: Path):
        self.dir = d
        self.stopping = False
        self.down: dict[str | None, dict[str, float]] = {}  # host -> {since, tried}: it did not answer
        self.queue = read_queue(d)
        self.manifest = read_manifest(d)
        self.cap = Capacity.from_placement(self.manifest.get("placement") or {})
        self.held: dict[str, Any] = {}  # variant -> the watch lock of its pool run, while the queue acts on it
        self.looks: dict[str, Any] = {}  # variant -> its rlctl.runs.failover.Failover

    # -- records ---------------------------------------------------------------------------------------------------
    def save(self, **top: Any) -> None:
        self.queue.update(top)
        write_json(self.dir / QUEUE, self.queue)

    def rec(self, vid: str) -> dict[str, Any]:
        return self.queue["variants"].setdefault(vid, {"state": "queued"})

    def log(self, msg: str) -> None:
        sys.stdout.write(time.strftime("%H:%M:%S ") + msg + "\n")
        sys.stdout.flush()

    # -- adoption (a queue started again) ----------------------------------------------------------------------------
    def adopt(self) -> None:
        from rlctl.runs.state import ACTIVE, process_alive, read_state, runs_root, settled_status
        from rlctl.runs.supervisor import resume_detached

        root = Path(self.manifest.get("placement", {}).get("runs_root") or runs_root())
        for v in self.manifest.get("variants", []):
            r = self.rec(v["id"])
            if r["state"] == "launching":  # killed between creating the run and recording it: find it by name
                found = sorted(p for p in root.glob(f"{v['run_name']}-*") if (p / "state.json").is_file())
                if found:
                    r.update(state="running", run_dir=str(found[-1]))
                else:
                    r.update(state="queued")
            if r["state"] == "done" and r.get("status") in ("stopped", "unreachable") and r.get("run_dir"):
                r["state"] = "running"  # stopped with the experiment, or its host was down: asked again
            if r["state"] != "running" or not r.get("run_dir"):
                continue
            run_dir = Path(r["run_dir"])
            st = read_state(run_dir)
            if process_alive(st.get("supervisor_pid"), st.get("supervisor_create_time")):
                self.cap.hold(v["id"], r.get("slot"))
                continue
            status = settled_status(run_dir, st)
            if status == "finished" or (status not in ACTIVE and status not in ("lost", "stopped")):
                continue  # ended: the next tick records it
            try:  # interrupted (reboot, kill -9 of everything): its own supervisor picks it up from its checkpoint
                self.log(f"{v['id']}: {resume_detached(run_dir)}")
                self.cap.hold(v["id"], r.get("slot"))
                r["resumed"] = int(r.get("resumed", 0)) + 1
            except RlctlError as e:
                r.update(state="done", error=f"could not resume {run_dir.name}: {e}")
        self.save()

    # -- one variant -------------------------------------------------------------------------------------------------
    def launch(self, v: dict[str, Any], slot: Slot) -> None:
        from rlctl.runs.launch import LaunchOptions
        from rlctl.runs.launch import launch as do_launch
        from rlctl.runs.state import read_state

        arm = next(a for a in self.manifest["arms"] if a["id"] == v["arm"])
        placement = self.manifest.get("placement") or {}
        r = self.rec(v["id"])
        r.update(state="launching", slot=slot.to_dict(), launched_at=time.time())
        self.save()
        sets = [*arm["sets"], f"train.seed={v['seed']}"]
        opts = LaunchOptions(arm["recipe"], sets, detach=True, name=v["run_name"],
                             force=bool(placement.get("force")), executor=placement.get("executor"),
                             address=placement.get("address"))
        # each variant syncs under a prefix of its own: sharing the recipe's, variants overwrote each other's `latest`
        opts.sets = [*opts.sets, *_own_store(arm["recipe"], opts.sets, v["run_name"])]
        hosts = list(placement.get("hosts") or [])
        if slot.host is not None:  # with several hosts, a pool run of them (its slot's host first): it can move
            opts.on = [slot.host, *[h for h in hosts if h != slot.host]] if len(hosts) > 1 else slot.host
        try:
            with visible_gpus(slot.gpus):
                run_dir, _ = do_launch(opts, out=sys.stdout)
        except Unreachable as e:  # the place did not answer: the variant waits (elsewhere, or for the host)
            r.update(state="queued", slot=None, error=None)
            self.cap.free(v["id"])
            self.mark_down(slot.host)
            self.log(f"{v['id']}: not launched, {slot.host or 'local'} unreachable: {e.message}")
            return
        except (RlctlError, OSError) as e:
            r.update(state="launch-failed", error=str(e), ended_at=time.time())
            self.cap.free(v["id"])
            self.log(f"{v['id']}: launch failed: {e}")
            return
        except Exception as e:  # a bug must not stop the other variants
            r.update(state="launch-failed", error=f"internal error: {type(e).__name__}: {e}", ended_at=time.time())
            self.cap.free(v["id"])
            self.log(f"{v['id']}: launch failed: {type(e).__name__}: {e}")
            return
        actual = read_state(run_dir).get("host")
        if slot.host is not None and actual and actual != slot.host:  # the slot's host did not fit: another did
            slot = Slot(f"{actual}#{slot.index}", actual, (), v["id"], slot.index)
            r["slot"] = slot.to_dict()
            self.cap.hold(v["id"], r["slot"])
        write_json(run_dir / "experiment.json", {"experiment": self.manifest["name"], "variant": v["id"],
                                                  "arm": v["arm"], "seed": v["seed"], "slot": slot.to_dict()})
        r.update(state="running", run_dir=str(run_dir))
        self.log(f"{v['id']}: launched {run_dir.name} on {slot.name}")

    def settle(self) -> None:
        """Record the variants whose runs ended (however: finished, failed after its restarts, stopped, lost)."""
        from rlctl.runs.state import ACTIVE, read_state

        silent: set[str | None] = set()
        answered: set[str | None] = set()
        for vid, r in self.queue["variants"].items():
            if r.get("state") != "running" or not r.get("run_dir"):
                continue
            run_dir = Path(r["run_dir"])
            host = (r.get("slot") or {}).get("host")
            try:  # one unanswered call per down host and tick: the others on it would wait out the same timeout
                status = "unreachable" if host is not None and host in silent else self.look(vid, run_dir)
                was, host = host, (r.get("slot") or {}).get("host")  # a failover may have moved it
                if host != was and r.pop("unreachable_since", None) is not None:
                    self.log(f"{vid}: moved from {was} to {host}")
            except Exception as e:  # a damaged run directory ends its variant, not the queue
                status = f"unreadable ({type(e).__name__})"
            if status == "unreachable":  # the run may well go on there: its slot stays held, the host gets no more
                silent.add(host)
                self.mark_down(host)
                if "unreachable_since" not in r:
                    r["unreachable_since"] = time.time()
                    self.log(f"{vid}: host {host or 'local'} unreachable: "
                             f"{read_state(run_dir).get('unreachable') or 'no answer'}")
                if time.time() - r["unreachable_since"] < UNREACHABLE_S:
                    continue
                r.update(state="done", status="unreachable", ended_at=time.time(),
                         error=f"host {host} unreachable for {UNREACHABLE_S:.0f} s; "
                               f"rlctl experiment resume {self.manifest['name']} asks again")
                self.cap.free(vid)
                self.log(f"{vid}: unreachable; given up on for now")
                continue
            answered.add(host)
            if r.pop("unreachable_since", None) is not None:
                self.log(f"{vid}: host {host or 'local'} answers again")
                r.pop("error", None)
            if status not in ACTIVE:
                r.update(state="done", status=status, ended_at=time.time())
                self.cap.free(vid)
                self.release(vid)
                self.log(f"{vid}: {status}")
        for host in answered - silent:
            self.down.pop(host, None)

    def look(self, vid: str, run_dir: Path) -> str:
        """A run's status; a pool run's by the rule `rlctl watch` follows (moved when its host is gone), unless a
        watcher acts on it (its lock): then as that one records it."""
        from rlctl.runs.state import read_state, settled_status

        st = read_state(run_dir)
        if not isinstance(st.get("pool"), dict):  # a host's run answers `stalled` while it lives: its watchdog acts
            status = settled_status(run_dir, st)
            return "running" if status == "stalled" else status
        if vid not in self.held:
            from rlctl.runs.watch import hold

            fh = hold(run_dir)
            if fh is None:
                return str(st.get("status") or "unknown")
            self.held[vid] = fh
        if vid not in self.looks:
            from rlctl.runs.failover import Failover

            self.looks[vid] = Failover(run_dir, sys.stdout, pick=lambda exclude, vid=vid: self.move(vid, exclude))
        status = self.looks[vid].step()
        host = read_state(run_dir).get("host")
        r = self.rec(vid)
        if host and host != (r.get("slot") or {}).get("host"):
            r["slot"] = {**(r.get("slot") or {}), "host": host}
        return "running" if status == "stalled" else status

    def move(self, vid: str, exclude: set[str]) -> tuple[str | None, list[str]]:
        """A place on another host for a run that fails over: its slot moves there (or stays, when none is free)."""
        need = ((self.manifest.get("placement") or {}).get("needs") or {}).get(vid) or {}
        old = self.cap.used.get(vid)
        self.cap.free(vid)
        slot = self.cap.take(vid, int(need.get("gpus") or 0), need.get("gib"), None,
                             set(exclude) | self.skip_hosts())
        if slot is None:
            if old is not None:
                self.cap.used[vid] = old
            return None, [f"no free place on another host of {self.manifest['name']}"]
        self.rec(vid)["slot"] = slot.to_dict()
        return slot.host, []

    def release(self, vid: str) -> None:
        fh = self.held.pop(vid, None)
        if fh is not None:
            fh.close()
        self.looks.pop(vid, None)

    def mark_down(self, host: str | None) -> None:
        now = time.time()
        self.down.setdefault(host, {"since": now})["tried"] = now

    def skip_hosts(self) -> set[str | None]:
        """Hosts that get no new run now: down, and tried less than RETRY_S ago (a launch there is the probe)."""
        return {h for h, d in self.down.items() if time.time() - d["tried"] < RETRY_S}

    def all_hosts_gone(self) -> bool:
        """Every host down for UNREACHABLE_S, none of our runs left to wait for: nothing more can happen."""
        hosts = self.cap.placement.get("hosts") or [None]
        return not self.running() and all(h in self.down and time.time() - self.down[h]["since"] >= UNREACHABLE_S
                                          for h in hosts)

    # -- the loop --------------------------------------------------------------------------------------------------
    def pending(self) -> list[dict[str, Any]]:
        return [v for v in self.manifest.get("variants", []) if self.rec(v["id"])["state"] == "queued"]

    def running(self) -> list[str]:
        return [vid for vid, r in self.queue["variants"].items() if r.get("state") in ("running", "launching")]

    def run(self) -> int:
        self.save(pid=os.getpid(), started_at=time.time(), state="running", create_time=_create_time())
        self.log(f"queue for {self.manifest['name']} (pid {os.getpid()})")
        self.adopt()
        needs = self.manifest.get("placement", {}).get("needs") or {}
        while True:
            self.manifest = read_manifest(self.dir)  # `--seeds` more adds variants while the queue runs
            self.settle()
            if self.stopping:
                return self.stop_all()
            free_gib = local_gpu_free_gib() if self.cap.gpu_ids and self.pending() else None
            for v in self.pending():
                need = needs.get(v["id"]) or {}
                slot = self.cap.take(v["id"], int(need.get("gpus") or 0), need.get("gib"), free_gib,
                                     self.skip_hosts())
                if slot is None:
                    break
                self.launch(v, slot)
                self.save()
                if self.stopping:
                    break
            self.save(hosts_down={h or "local": d["since"] for h, d in self.down.items()})
            lost = [vid for vid, r in self.queue["variants"].items() if r.get("status") == "unreachable"]
            if not self.pending() and not self.running():
                self.save(state="incomplete" if lost else "finished", ended_at=time.time())
                self.log(f"all variants done; {len(lost)} unreachable ({', '.join(lost)}): rlctl experiment resume "
                         f"{self.manifest['name']} once their host is back" if lost else "all variants done")
                return 0
            if self.pending() and self.all_hosts_gone():
                self.save(state="incomplete", ended_at=time.time())
                self.log(f"{len(self.pending())} variants wait, {len(lost)} unreachable, and no host answers for "
                         f"{UNREACHABLE_S:.0f} s: rlctl experiment resume {self.manifest['name']} once one is back")
                return 1
            time.sleep(TICK)

    def stop_all(self) -> int:
        from rlctl.runs.stopping import stop_run

        grace = float((self.manifest.get("placement") or {}).get("grace", 30.0))
        for vid in self.running():
            r = self.rec(vid)
            if r.get("run_dir"):
                with contextlib.suppress(Exception):
                    self.log(f"{vid}: {stop_run(Path(r['run_dir']), grace)}")
        self.settle()
        self.save(state="stopped", ended_at=time.time())
        self.log("stopped")
        return 0


def _own_store(recipe: str, sets: list[str], run_name: str) -> list[str]:
    """Two variants must not share a checkpoint.sync store (each writes its own `latest`; a pool run fences its
    attempts there): each gets a prefix of its own under the recipe's URL (--set checkpoint.sync=URL/<run name>)."""
    import json

    from rlctl.recipe.loader import load

    try:
        url = load(recipe, sets).recipe.checkpoint.sync
    except Exception:  # the launch says what is wrong with the recipe
        return []
    return [f"checkpoint.sync={json.dumps(url.rstrip('/') + '/' + run_name)}"] if url else []


def _create_time() -> float | None:
    from rlctl.runs.state import process_create_time

    return process_create_time(os.getpid())


def queue_state(d: Path) -> str:
    """What the queue is doing, true even after a kill -9 (its record then still says running)."""
    q = read_json(d / QUEUE)
    pid = queue_alive(d)
    if pid:
        return f"running (pid {pid})"
    if q.get("state") == "running":
        return f"dead (pid {q.get('pid')} is gone; rlctl experiment resume {d.name})"
    return str(q.get("state") or "-")


def start_detached(d: Path, timeout: float = 30.0) -> int:
    """Start the queue in its own session; returns its pid once it has recorded itself (or one already runs)."""
    pid = queue_alive(d)
    if pid:
        return pid
    before = read_json(d / QUEUE).get("pid")
    args = [sys.executable, "-m", "rlctl.experiments.queue", str(d.resolve())]
    with open(d / LOG, "ab") as log:
        p = subprocess.Popen(args, cwd=os.getcwd(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        q = read_json(d / QUEUE)
        if q.get("pid") == p.pid or (q.get("pid") not in (None, before) and queue_alive(d)):
            return int(q["pid"])
        if p.poll() is not None:
            raise RlctlError(f"the queue of {d.name} exited at once (code {p.returncode}); see {d / LOG}.")
        time.sleep(0.1)
    raise RlctlError(f"the queue of {d.name} did not start within {timeout:.0f} s; see {d / LOG}.")


def stop(d: Path, grace: float = 30.0, wait: float = 120.0) -> str:
    """Stop an experiment: its queue stops its running runs and exits; with no live queue, the runs are stopped
    from here."""
    from rlctl.runs.state import process_alive

    pid = queue_alive(d)
    if pid:
        q = read_json(d / QUEUE)
        os.kill(pid, signal.SIGTERM)
        deadline = time.time() + wait + grace
        while time.time() < deadline and process_alive(pid, q.get("create_time")):
            time.sleep(0.2)
        return f"{d.name}: stopped (queue pid {pid})"
    from rlctl.runs.state import ACTIVE, read_state
    from rlctl.runs.stopping import stop_run

    lines = []
    for r in read_queue(d)["variants"].values():
        if r.get("run_dir") and read_state(Path(r["run_dir"])).get("status") in ACTIVE:
            lines.append(stop_run(Path(r["run_dir"]), grace))
    return "\n".join([f"{d.name}: no queue running", *lines])


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    d = Path(args[0]).resolve()
    lock = open(d / LOCK, "a")  # noqa: SIM115 - held for the life of the process
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.stdout.write(f"another queue runs for {d.name}; this one exits\n")
        return 0
    placement = read_manifest(d).get("placement") or {}
    if placement.get("runs_root"):
        os.environ["RLCTL_RUNS_DIR"] = placement["runs_root"]
    q = Queue(d)

    def request_stop(signum: int, frame: Any) -> None:  # noqa: ARG001
        q.stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        return q.run()
    except RlctlError as e:
        sys.stdout.write(f"rlctl: {e}\n")
        q.save(state="failed", error=str(e), ended_at=time.time())
        return 1


if __name__ == "__main__":
    sys.exit(main())
