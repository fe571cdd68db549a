"""The Ray executor: submit the rendered command as a Ray job (Ray's job submission API), follow its logs into the
run directory, stop it with the job API. With no cluster address rlctl starts a Ray head on loopback for the run
and stops it afterwards; with an address it never starts or stops anything.

Status and stop speak Ray's REST job API with urllib, so `rlctl status` never imports ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError
from rlctl.executors.local import _group_alive
from rlctl.metrics.sinks import SinkPump
from rlctl.metrics.stream import LOG, ingest
from rlctl.runs.state import ACTIVE, process_alive, process_create_time, read_state, write_state

SPEC = ".launch.json"
TERMINAL = {"SUCCEEDED": "finished", "FAILED": "failed", "STOPPED": "stopped"}
EXCLUDES = ["stdout.log", "metrics.jsonl", "backend_metrics.jsonl", "supervisor.log", "ray-head.log",
            "checkpoints", ".ingest.*", "state.json", "*.tmp"]


# ---------------------------------------------------------------------------------------------------------------
# REST (no ray import)


def _http(method: str, url: str, timeout: float = 10.0, data: bytes | None = None) -> Any:
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the user's own cluster
        body = resp.read().decode("utf-8", errors="replace")
    try:
        return json.loads(body)
    except ValueError:
        return body


def normalize_address(address: str) -> str:
    a = address.strip()
    if a.startswith("ray://"):
        raise RlctlError(f"{a}: rlctl submits through the job API; give the dashboard address "
                         "(http://HEAD:8265), not a ray:// client address.")
    if not a.startswith(("http://", "https://")):
        a = "http://" + a
    return a.rstrip("/")


def cluster_info(address: str, timeout: float = 5.0) -> dict[str, Any]:
    """The Ray version and the alive nodes with their resources, or RlctlError if unreachable."""
    base = normalize_address(address)
    try:
        version = _http("GET", f"{base}/api/version", timeout)
        nodes = _http("GET", f"{base}/api/v0/nodes?limit=1000", timeout)
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise RlctlError(f"Ray cluster at {base} is not reachable ({getattr(e, 'reason', e)}).",
                         hint="check the address (dashboard port, 8265 by default) and that the head runs") from None
    rows = nodes.get("data", {}).get("result", {}).get("result", []) if isinstance(nodes, dict) else []
    alive = [n for n in rows if n.get("state") == "ALIVE"]
    return {"ray_version": version.get("ray_version") if isinstance(version, dict) else None,
            "nodes": [{"ip": n.get("node_ip"), "gpus": int(n.get("resources_total", {}).get("GPU", 0)),
                       "cpus": int(n.get("resources_total", {}).get("CPU", 0))} for n in alive]}


def _job_field(method: str, address: str, path: str, key: str, timeout: float, data: bytes | None = None) -> Any:
    """One field of a job-API answer, or None when the cluster cannot be reached or answers something else."""
    try:
        info = _http(method, f"{normalize_address(address)}/api/jobs/{path}", timeout, data)
    except (urllib.error.URLError, OSError, TimeoutError):
        return None
    return info.get(key) if isinstance(info, dict) else None


def job_status(address: str, job_id: str, timeout: float = 5.0) -> str | None:
    return _job_field("GET", address, job_id, "status", timeout)


def job_logs(address: str, job_id: str, timeout: float = 30.0) -> str | None:
    return _job_field("GET", address, f"{job_id}/logs", "logs", timeout)


def stop_job_rest(address: str, job_id: str) -> bool:
    return bool(_job_field("POST", address, f"{job_id}/stop", "stopped", 10.0, data=b"{}"))


def catch_up_logs(run_dir: Path, state: dict[str, Any]) -> None:
    """Nobody follows the job (rlctl was killed): copy what the job logged since into stdout.log."""
    logs = job_logs(state["ray_address"], state["ray_job_id"])
    if logs is None:
        return
    data = logs.encode("utf-8", errors="replace")
    log = run_dir / LOG
    have = log.stat().st_size if log.exists() else 0
    if len(data) > have:
        with log.open("ab") as fh:
            fh.write(data[have:])


def true_ray_status(run_dir: Path, state: dict[str, Any]) -> str:
    status = state.get("status", "unknown")
    if status not in ACTIVE:
        return status
    if process_alive(state.get("supervisor_pid"), state.get("supervisor_create_time")):
        return status
    if not state.get("ray_job_id"):
        return "lost"
    js = job_status(state["ray_address"], state["ray_job_id"])
    if js is None:
        return "lost"
    if js in TERMINAL:
        catch_up_logs(run_dir, state)
        write_state(run_dir, status=TERMINAL[js], ended_at=time.time(), ray_job_status=js)
        return TERMINAL[js]
    catch_up_logs(run_dir, state)
    return "running"


# ---------------------------------------------------------------------------------------------------------------
# a Ray head on loopback, owned by the run


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_cli() -> list[str]:
    exe = shutil.which("ray")
    return [exe] if exe else [sys.executable, "-m", "ray.scripts.scripts"]


class LocalHead:
    """`ray start --head --block` on 127.0.0.1 with free ports, in its own process group."""

    def __init__(self, run_dir: Path, num_gpus: int | None = None):
        self.run_dir = run_dir
        self.num_gpus = num_gpus
        self.proc: subprocess.Popen | None = None
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rlctl-ray-", dir="/tmp"))  # short: unix socket paths
        self.port = free_port()
        self.dashboard_port = free_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"

    def start(self, timeout: float = 120.0) -> str:
        env = dict(os.environ)
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # single-node: Ray then binds to loopback only
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        cmd = [*_ray_cli(), "start", "--head", f"--port={self.port}", "--dashboard-host=127.0.0.1",
               f"--dashboard-port={self.dashboard_port}", f"--temp-dir={self.temp_dir}", "--include-dashboard=true",
               "--disable-usage-stats", "--block"]
        # every fixed default port (client server 10001, agent 52365, ...) would clash with a second head
        for flag in ("--ray-client-server-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                     "--metrics-export-port", "--runtime-env-agent-port"):
            cmd.insert(-1, f"{flag}={free_port()}")
        if self.num_gpus is not None:
            cmd.append(f"--num-gpus={self.num_gpus}")
        with open(self.run_dir / "ray-head.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        write_state(self.run_dir, ray_head_pid=self.proc.pid, ray_head_create_time=process_create_time(self.proc.pid),
                    ray_head_temp_dir=str(self.temp_dir), ray_started_head=True, ray_address=self.address)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RlctlError(f"the local Ray head exited at start; see {self.run_dir / 'ray-head.log'}.")
            try:
                info = cluster_info(self.address, timeout=2)
                if info["nodes"]:
                    return self.address
            except RlctlError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RlctlError(f"the local Ray head did not come up in {timeout:.0f}s; see {self.run_dir / 'ray-head.log'}.")

    def stop(self) -> None:
        stop_head(self.proc.pid if self.proc else None, str(self.temp_dir))
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)  # reap it: no zombie left behind


def stop_head(pid: int | None, temp_dir: str | None, grace: float = 5.0) -> None:
    """Stop a head rlctl started: its whole process group (SIGINT is what `ray start --block` acts on, then
    SIGTERM, then SIGKILL), and any straggler that used its temp dir. Never `ray stop`: that would take every
    Ray process of the machine, including other people's clusters."""
    if pid:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            deadline = time.time() + grace
            while time.time() < deadline and _live_members(pid):
                time.sleep(0.2)
            if not _live_members(pid):
                break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    if temp_dir:
        _kill_by_temp_dir(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _live_members(pgid: int) -> bool:
    """True while a non-zombie process of the group exists."""
    try:
        import psutil
    except ImportError:
        return _group_alive(pgid)
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return False


def _kill_by_temp_dir(temp_dir: str) -> None:
    try:
        import psutil
    except ImportError:
        return
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_dir in (a or "") for a in (p.info["cmdline"] or [])):
                p.kill()
        except psutil.Error:
            continue


# ---------------------------------------------------------------------------------------------------------------
# the run


class RayRun:
    def __init__(self, run_dir: Path, spec: dict[str, Any], env: dict[str, str],
                 on_tick: Callable[[Path], None] | None = None):
        self.run_dir = run_dir
        self.spec = spec
        self.env = env
        self.on_tick = on_tick
        self.head: LocalHead | None = None
        self.client: Any = None
        self.job_id: str | None = None
        self.stop_requested = False
        self.tail_error: str | None = None
        self.sinks = SinkPump(run_dir, spec.get("sinks"))

    def request_stop(self, signum: int = signal.SIGTERM, frame: Any = None) -> None:  # noqa: ARG002
        if not self.stop_requested:
            self.stop_requested = True
            write_state(self.run_dir, status="stopping", stop_requested_at=time.time())
            if self.client is not None and self.job_id:
                with contextlib.suppress(Exception):
                    self.client.stop_job(self.job_id)

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def start(self) -> None:
        from ray.job_submission import JobSubmissionClient

        write_state(self.run_dir, supervisor_pid=os.getpid(), supervisor_create_time=process_create_time(os.getpid()))
        address = self.spec.get("address")
        if address is None:
            self.head = LocalHead(self.run_dir, self.spec.get("num_gpus"))
            address = self.head.start()
        address = normalize_address(address)
        self.client = JobSubmissionClient(address)
        job_env = {k: self.env[k] for k in self.spec.get("env_keys", []) if k in self.env}
        runtime_env: dict[str, Any] = {"working_dir": str(self.run_dir), "excludes": EXCLUDES, "env_vars": job_env}
        if self.spec.get("pip"):
            runtime_env["pip"] = list(self.spec["pip"])
        submission_id = f"rlctl-{self.run_dir.name}-{uuid.uuid4().hex[:6]}"
        deadline = time.time() + 90
        while True:
            try:
                self.job_id = self.client.submit_job(entrypoint=shlex.join(self.spec["argv"]),
                                                     runtime_env=runtime_env, submission_id=submission_id)
                break
            except Exception as e:
                # a fresh head answers before its job agent is up: "No available agent to submit job"
                if "No available agent" in str(e) and time.time() < deadline:
                    time.sleep(1.0)
                    continue
                self._cleanup_head()
                write_state(self.run_dir, status="failed", ended_at=time.time(), error=f"job submission failed: {e}")
                raise RlctlError(f"Ray job submission to {address} failed: {e}") from None
        write_state(self.run_dir, status="running", ray_job_id=self.job_id, ray_address=address)

    def _tail(self) -> None:
        async def run() -> None:
            with open(self.run_dir / LOG, "ab") as fh:
                async for chunk in self.client.tail_job_logs(self.job_id):
                    fh.write(chunk.encode("utf-8", errors="replace"))
                    fh.flush()

        try:
            asyncio.run(run())
        except Exception as e:  # the websocket can drop; the final catch-up fetches the rest
            self.tail_error = str(e)

    def loop(self) -> int:
        tail = threading.Thread(target=self._tail, daemon=True)
        tail.start()
        status = None
        while True:
            try:
                status = str(self.client.get_job_status(self.job_id))
            except Exception:
                status = None
            ingest(self.run_dir, self.spec["backend"])
            self.sinks.pump()
            if self.on_tick:
                self.on_tick(self.run_dir)
            if status in TERMINAL:
                break
            time.sleep(1.0)
        tail.join(timeout=15)
        state = read_state(self.run_dir)
        catch_up_logs(self.run_dir, {**state, "ray_job_id": self.job_id})
        ingest(self.run_dir, self.spec["backend"], final=True)
        self.sinks.pump(close=True)
        if self.on_tick:
            self.on_tick(self.run_dir)
        outcome = "stopped" if self.stop_requested else TERMINAL[status]
        code = {"finished": 0, "stopped": 143}.get(outcome, 1)
        write_state(self.run_dir, status=outcome, exit_code=code, ray_job_status=status, ended_at=time.time())
        self._cleanup_head()
        return code

    def _cleanup_head(self) -> None:
        if self.head is not None:
            self.head.stop()
            write_state(self.run_dir, ray_head_stopped=True)

    def run(self) -> int:
        self.install_signal_handlers()
        self.start()
        return self.loop()


def launch_ray(run_dir: Path, prep: Any, child_env: dict[str, str], opts: Any, out: Any) -> int:
    from rlctl.executors.local import write_spec
    from rlctl.ui.progress import Progress

    recipe = prep.recipe
    address = opts.address or recipe.resources.ray_address or os.environ.get("RAY_ADDRESS")
    plan = prep.plan
    argv = list(plan.argv)
    if "--" in argv and argv[:3] == ["ray", "job", "submit"]:
        argv = argv[argv.index("--") + 1:]  # rlctl submits itself; the entrypoint is what follows `--`
    if address is None and argv and argv[0] in ("python3", "python"):
        argv[0] = sys.executable  # a head rlctl starts runs on this machine, in this environment
    env_keys = sorted(set(plan.env) | {k for k in child_env if k.startswith(("RLCTL_", "WANDB_RUN_ID", "WANDB_RESUME"))}
                      | {"PYTHONUNBUFFERED"})
    from rlctl.runs.launch import sink_spec

    spec = {"argv": argv, "backend": plan.backend, "address": address, "env_keys": env_keys,
            "sinks": sink_spec(recipe, run_dir, read_state(run_dir).get("wandb_run_id")),
            "num_gpus": recipe.resources.gpus_per_node if address is None else None,
            "pip": recipe.resources.pip, "executor": "ray"}
    write_spec(run_dir, spec)
    write_state(run_dir, executor="ray", ray_started_head=address is None)
    if opts.detach:
        with open(run_dir / "supervisor.log", "ab") as log:
            subprocess.Popen([sys.executable, "-m", "rlctl.executors.ray", str(run_dir)], env=child_env,
                             cwd=run_dir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        deadline = time.time() + 180
        while time.time() < deadline:
            st = read_state(run_dir)
            if st.get("ray_job_id") or st.get("status") == "failed":
                break
            time.sleep(0.2)
        st = read_state(run_dir)
        if st.get("status") == "failed":
            raise RlctlError(f"the Ray run failed to start: {st.get('error', 'see supervisor.log')}")
        return 0
    progress = Progress(out, plan.total_steps)
    run = RayRun(run_dir, spec, child_env, on_tick=progress.tick)
    run.install_signal_handlers()
    run.start()
    code = run.loop()
    progress.done(run_dir)
    return code


def stop_ray_job(run_dir: Path, state: dict[str, Any], grace: float = 60.0) -> str:
    if process_alive(state.get("supervisor_pid"), state.get("supervisor_create_time")):
        os.kill(state["supervisor_pid"], signal.SIGTERM)
        deadline = time.time() + grace + 60
        while time.time() < deadline and read_state(run_dir).get("status") in ACTIVE:
            time.sleep(0.2)
        return f"{run_dir.name}: {read_state(run_dir).get('status')}"
    if state.get("ray_job_id"):
        stop_job_rest(state["ray_address"], state["ray_job_id"])
        deadline = time.time() + grace
        while time.time() < deadline and job_status(state["ray_address"], state["ray_job_id"]) not in TERMINAL:
            time.sleep(0.5)
        catch_up_logs(run_dir, state)
    if state.get("ray_started_head") and not state.get("ray_head_stopped"):
        stop_head(state.get("ray_head_pid"), state.get("ray_head_temp_dir"))
        write_state(run_dir, ray_head_stopped=True)
    write_state(run_dir, status="stopped", ended_at=time.time())
    return f"{run_dir.name}: stopped"


def main(argv: list[str] | None = None) -> int:
    """Detached: `python -m rlctl.executors.ray RUN_DIR` (our environment is the job's)."""
    args = argv if argv is not None else sys.argv[1:]
    run_dir = Path(args[0])
    spec = json.loads((run_dir / SPEC).read_text())
    run = RayRun(run_dir, spec, dict(os.environ))
    try:
        return run.run()
    except RlctlError as e:
        write_state(run_dir, status="failed", ended_at=time.time(), error=str(e))
        return 1


if __name__ == "__main__":
    sys.exit(main())
