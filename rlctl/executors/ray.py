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
import re
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
from pathlib import Path
from typing import Any, ClassVar

from rlctl.core.secrets import is_secret_name
from rlctl.core.state import ACTIVE, process_alive, process_create_time, read_state, write_state
from rlctl.errors import RlctlError
from rlctl.executors.base import Executor, RunHandle
from rlctl.executors.local import _group_alive
from rlctl.metrics.stream import LOG

TERMINAL = {"SUCCEEDED": "finished", "FAILED": "failed", "STOPPED": "stopped"}
EXCLUDES = ["stdout.log", "metrics.jsonl", "backend_metrics.jsonl", "supervisor.log", "ray-head.log",
            "checkpoints", ".ingest.*", "state.json", "*.tmp", "attempts", ".step_floor", ".sync.json",
            "rlctl-events.jsonl"]


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
    """Nobody follows the job (rlctl was killed): copy what the job logged since into stdout.log. The job's log
    starts at `log_base` bytes into stdout.log (a restarted run's earlier attempts come first)."""
    handle = RunHandle.from_state(state)
    ref = handle.ref if handle is not None and handle.executor == "ray" else {}
    address, job_id = ref.get("address") or state.get("ray_address"), ref.get("job_id") or state.get("ray_job_id")
    if not address or not job_id:
        return
    logs = job_logs(address, job_id)
    if logs is None:
        return
    data = logs.encode("utf-8", errors="replace")
    log = run_dir / LOG
    have = (log.stat().st_size if log.exists() else 0) - int(ref.get("log_base") or 0)
    if len(data) > have >= 0:
        with log.open("ab") as fh:
            fh.write(data[have:])


def true_ray_status(run_dir: Path, state: dict[str, Any]) -> str:
    return RayExecutor().status(run_dir, state)


# ---------------------------------------------------------------------------------------------------------------
# a Ray head on loopback, owned by the run


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports. The sockets stay bound until all are chosen: ports picked one at a time can
    repeat (the kernel hands a just-released port out again), and Ray refuses two components on one port."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ray_cli() -> list[str]:
    exe = shutil.which("ray")
    return [exe] if exe else [sys.executable, "-m", "ray.scripts.scripts"]


_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def secret_names(plan_env: dict[str, str]) -> dict[str, str]:
    """The job's secrets: name -> the variable of rlctl's environment it comes from (a `${NAME}` reference, or a
    name the secrets rule matches). Their values never go into a job's runtime env (the Ray jobs API returns it to
    whoever reaches the dashboard) nor onto a command line."""
    out = {}
    for k, v in plan_env.items():
        m = _REF.match(v or "")
        if m or is_secret_name(k):
            out[k] = m.group(1) if m else k
    return out


def secret_values(names: dict[str, str]) -> dict[str, str]:
    """The secrets' values from this process's environment (a supervisor runs with the run's resolved environment;
    an in-process one with the user's, where a `${REF}` is found under REF)."""
    out = {}
    for k, ref in names.items():
        v = os.environ.get(ref, os.environ.get(k))
        if v is not None:
            out[k] = v
    return out


class LocalHead:
    """`ray start --head --block` on 127.0.0.1 with free ports, in its own process group. Its environment (and so
    every Ray worker's and job's: they are its children) holds the run's secrets, which therefore never travel in a
    job's runtime env."""

    def __init__(self, run_dir: Path, num_gpus: int | None = None, secrets: dict[str, str] | None = None):
        self.run_dir = run_dir
        self.num_gpus = num_gpus
        self.secrets = dict(secrets or {})
        self.proc: subprocess.Popen | None = None
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rlctl-ray-", dir="/tmp"))  # short: unix socket paths
        # the GCS, the dashboard and every component that would otherwise take a fixed default port (client server
        # 10001, agent 52365, ...) and clash with a second head: all distinct
        self.port, self.dashboard_port, *self.component_ports = free_ports(7)
        self.address = f"http://127.0.0.1:{self.dashboard_port}"

    def start(self, timeout: float = 120.0) -> str:
        env = {**os.environ, **self.secrets}
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # single-node: Ray then binds to loopback only
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        cmd = [*_ray_cli(), "start", "--head", f"--port={self.port}", "--dashboard-host=127.0.0.1",
               f"--dashboard-port={self.dashboard_port}", f"--temp-dir={self.temp_dir}", "--include-dashboard=true",
               "--disable-usage-stats", "--block"]
        for flag, port in zip(("--ray-client-server-port", "--dashboard-agent-listen-port",
                               "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port"),
                              self.component_ports, strict=True):
            cmd.insert(-1, f"{flag}={port}")
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
            while time.time() < deadline and _group_alive(pid):
                time.sleep(0.2)
            if not _group_alive(pid):
                break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    if temp_dir:
        _kill_by_temp_dir(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


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
# submitting while a fresh head's job agent starts

# Ray's job API answers a submission with HTTP 500 and this text while the head has no job agent yet (right after
# `ray start`: ray/dashboard/modules/job/job_head.py, submit_job, after waiting WAIT_AVAILABLE_AGENT_TIMEOUT for one);
# the answer itself says "please try again later". Any other failure is not retried.
NO_AGENT = "No available agent to submit job"
SUBMIT_LIMIT_S = 180.0  # how long rlctl keeps trying: a loaded machine's head can take minutes to start its agent
BACKOFF_S = (1.0, 15.0)  # the first wait, doubled each time up to the second


def _no_agent(error: Exception) -> bool:
    """Ray's SDK raises `RuntimeError("Request failed with status code 500: <body>.")` for that answer."""
    text = str(error)
    return NO_AGENT in text and "500" in text


def submit_when_agent_ready(submit: Any, address: str | None, limit: float = SUBMIT_LIMIT_S,
                            logs: Path | None = None) -> str:
    """`submit()` (a job submission), tried again with backoff while Ray answers that it has no job agent yet, up to
    `limit` seconds; each wait is said on the console. Returns the job id; any other failure, or the limit, is an
    RlctlError that says what Ray answered."""
    delay, start, tries = BACKOFF_S[0], time.monotonic(), 0
    while True:
        tries += 1
        try:
            return submit()
        except Exception as e:
            if not _no_agent(e):
                raise RlctlError(f"Ray job submission to {address} failed: {e}") from None
            waited = time.monotonic() - start
            if waited + delay > limit:
                where = f"see {logs / 'dashboard_agent.log'}" if logs else "see dashboard_agent.log in the head's logs"
                raise RlctlError(
                    f"Ray at {address} still has no job agent after {waited:.0f} s and {tries} submissions: it answers "
                    f"HTTP 500 \"{NO_AGENT}, please try again later\".",
                    hint=f"the head's dashboard agent did not start ({where}); when it runs, launch again") from None
            print(f"rlctl: Ray at {address} has no job agent yet (HTTP 500 \"{NO_AGENT}\", as right after `ray "
                  f"start`); submitting again in {delay:.0f} s ({waited:.0f} of at most {limit:.0f} s)",
                  file=sys.stderr, flush=True)
            time.sleep(delay)
            delay = min(delay * 2.0, BACKOFF_S[1])


# ---------------------------------------------------------------------------------------------------------------
# the run


class RayExecutor(Executor):
    """Each attempt is a Ray job (job submission API); with no address, the run owns a head on loopback for all
    its attempts."""

    name: ClassVar[str] = "ray"
    copies_working_dir: ClassVar[bool] = True
    remote: ClassVar[bool] = True
    gives_ray_cluster: ClassVar[bool] = True
    checks: ClassVar[tuple[str, ...]] = ("env.ray",)

    def preflight(self, ctx: Any) -> list[Any]:
        """env.ray: the cluster answers and has the nodes and GPUs the recipe places work on."""
        import importlib.util

        from rlctl.preflight import FAIL, OK, WARN, Result

        r = ctx.recipe
        address = r.resources.ray_address or os.environ.get("RAY_ADDRESS")
        if address is None:
            if importlib.util.find_spec("ray") is None:
                return [Result("env.ray", FAIL, "no Ray address and ray is not installed to start a local head",
                               'pip install "rlctl[ray]", or set resources.ray_address / RAY_ADDRESS')]
            return [Result("env.ray", OK,
                           "no address: rlctl starts a Ray head on 127.0.0.1 for the run and stops it after")]
        try:
            info = cluster_info(address)
        except RlctlError as e:
            return [Result("env.ray", FAIL, e.message, e.hint)]
        out = []
        plan = getattr(ctx.prepared, "plan", None)
        secrets = sorted(secret_names(dict(getattr(plan, "env", None) or {})))
        if secrets:
            out.append(Result("env.ray", WARN, f"{', '.join(secrets)} will not be sent to the cluster at {address}: "
                              "a job's runtime env is readable by whoever reaches the dashboard",
                              "give the cluster's nodes the variable themselves (in the environment `ray start` runs "
                              "with); see docs/ray.md"))
        nodes = info["nodes"]
        need = r.resources.gpus_per_node
        fit = [n for n in nodes if n["gpus"] >= need]
        figure = (f"Ray {info['ray_version']} at {address}: {len(nodes)} node(s), GPUs per node "
                  f"{[n['gpus'] for n in nodes]}")
        if len(fit) < r.resources.nodes:
            return [*out, Result("env.ray", FAIL, figure + f"; the recipe needs {r.resources.nodes} node(s) with "
                                 f"{need} GPU(s)", "add nodes to the cluster or lower resources.nodes / gpus_per_node")]
        return [*out, Result("env.ray", OK, figure)]

    def __init__(self) -> None:
        self.head: LocalHead | None = None
        self.client: Any = None
        self.address: str | None = None
        self.tails: dict[int, threading.Thread] = {}
        self.tail_error: str | None = None

    # ---- launch ------------------------------------------------------------------------------------------------
    def command(self, plan: Any, backend: Any, spec: dict[str, Any]) -> list[str]:
        argv = list(plan.argv)
        if "--" in argv and argv[:3] == ["ray", "job", "submit"]:
            argv = argv[argv.index("--") + 1:]  # rlctl submits itself; the entrypoint is what follows `--`
        if not spec.get("address") and argv and argv[0] in ("python3", "python"):
            argv[0] = sys.executable  # a head rlctl starts runs on this machine, in this environment
        return argv

    def prepare(self, run_dir: Path, spec: dict[str, Any], env: dict[str, str], plan: Any, recipe: Any,
                opts: Any) -> dict[str, Any]:
        address = getattr(opts, "address", None) or recipe.resources.ray_address or os.environ.get("RAY_ADDRESS")
        secrets = secret_names(plan.env)
        env_keys = sorted((set(plan.env) | {k for k in env if k.startswith(("RLCTL_", "WANDB_RUN_ID", "WANDB_RESUME"))}
                           | {"PYTHONUNBUFFERED"}) - set(secrets) - {k for k in env if is_secret_name(k)})
        # names only: a local head gets the values in its environment when it starts; a remote cluster never
        spec = {**spec, "address": address, "env_keys": env_keys, "secret_env": secrets, "pip": recipe.resources.pip,
                "num_gpus": recipe.resources.gpus_per_node if address is None else None}
        if address is not None and secrets:
            print(f"rlctl: {', '.join(sorted(secrets))} not sent to the Ray cluster at {address} (a job's runtime env "
                  "is readable by whoever reaches its dashboard): the cluster's nodes must have it in their "
                  "environment; see docs/ray.md", file=sys.stderr)
        spec["argv"] = self.command(plan, None, spec)
        write_state(run_dir, executor="ray", ray_started_head=address is None)
        return spec

    # ---- attempts ----------------------------------------------------------------------------------------------
    def open(self, run_dir: Path, spec: dict[str, Any]) -> None:
        from ray.job_submission import JobSubmissionClient

        state = read_state(run_dir)
        address = spec.get("address")
        if address is None and state.get("ray_started_head") and not state.get("ray_head_stopped") and \
                process_alive(state.get("ray_head_pid"), state.get("ray_head_create_time")):
            address = state.get("ray_address")  # `rlctl resume`: the run's own head outlived its supervisor
        if address is None:
            self.head = LocalHead(run_dir, spec.get("num_gpus"), secret_values(spec.get("secret_env") or {}))
            address = self.head.start()
        self.address = normalize_address(address)
        self.client = JobSubmissionClient(self.address)
        write_state(run_dir, ray_address=self.address)

    def close(self) -> None:
        if self.head is not None:
            self.head.stop()
            write_state(self.head.run_dir, ray_head_stopped=True)
            self.head = None

    def start(self, run_dir: Path, spec: dict[str, Any], env: dict[str, str], attempt: int) -> RunHandle:
        job_env = {k: env[k] for k in spec.get("env_keys", []) if k in env and not is_secret_name(k)}
        runtime_env: dict[str, Any] = {"working_dir": str(run_dir), "excludes": EXCLUDES, "env_vars": job_env}
        if spec.get("pip"):
            runtime_env["pip"] = list(spec["pip"])
        submission_id = f"rlctl-{run_dir.name}-{attempt}-{uuid.uuid4().hex[:6]}"
        log_base = (run_dir / LOG).stat().st_size if (run_dir / LOG).exists() else 0
        logs = self.head.temp_dir / "session_latest" / "logs" if self.head is not None else None
        job_id = submit_when_agent_ready(
            lambda: self.client.submit_job(entrypoint=shlex.join(spec["argv"]), runtime_env=runtime_env,
                                           submission_id=submission_id), self.address, logs=logs)
        write_state(run_dir, ray_job_id=job_id, ray_address=self.address)
        handle = RunHandle(self.name, {"address": self.address, "job_id": job_id, "log_base": log_base}, attempt)
        tail = threading.Thread(target=self._tail, args=(run_dir, job_id), daemon=True)
        tail.start()
        self.tails[attempt] = tail
        return handle

    def _tail(self, run_dir: Path, job_id: str) -> None:
        async def run() -> None:
            with open(run_dir / LOG, "ab") as fh:
                async for chunk in self.client.tail_job_logs(job_id):
                    fh.write(chunk.encode("utf-8", errors="replace"))
                    fh.flush()

        try:
            asyncio.run(run())
        except Exception as e:  # the websocket can drop; the final catch-up fetches the rest
            self.tail_error = str(e)

    def poll(self, run_dir: Path, handle: RunHandle) -> int | None:
        js = self._job_status(handle)
        if js not in TERMINAL:
            return None
        tail = self.tails.get(handle.attempt)
        if tail is not None and tail.is_alive():
            tail.join(timeout=15)
        catch_up_logs(run_dir, {"handle": handle.to_dict()})
        write_state(run_dir, ray_job_status=js)
        return {"SUCCEEDED": 0, "STOPPED": -signal.SIGTERM}.get(js, 1)

    def _job_status(self, handle: RunHandle) -> str | None:
        if self.client is not None:
            try:
                return str(self.client.get_job_status(handle.ref["job_id"]))
            except Exception:
                return None
        return job_status(handle.ref["address"], handle.ref["job_id"])

    def signal_stop(self, run_dir: Path, handle: RunHandle) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.stop_job(handle.ref["job_id"])
                return
        stop_job_rest(handle.ref["address"], handle.ref["job_id"])

    def kill(self, run_dir: Path, handle: RunHandle) -> None:
        self.signal_stop(run_dir, handle)  # Ray escalates to SIGKILL itself after its stop wait

    def pids(self, run_dir: Path, handle: RunHandle) -> list[int]:
        """On a head this run started (this machine): the job's processes, found by their working directory (the
        job's copy of the run directory under the head's temp dir)."""
        if self.head is None:
            return []
        import psutil

        temp = str(self.head.temp_dir)
        out = []
        for p in psutil.process_iter(["cwd", "status"]):
            try:
                cwd = p.info["cwd"] or ""
                if cwd.startswith(temp) and "runtime_resources" in cwd and p.info["status"] != psutil.STATUS_ZOMBIE:
                    out.append(p.pid)
            except psutil.Error:
                continue
        return out

    def pump_logs(self, run_dir: Path, handle: RunHandle) -> None:
        if handle is not None and handle.attempt not in self.tails:
            catch_up_logs(run_dir, {"handle": handle.to_dict()})

    # ---- any process -------------------------------------------------------------------------------------------
    def status(self, run_dir: Path, state: dict[str, Any]) -> str:
        status = state.get("status", "unknown")
        if status not in ACTIVE:
            return status
        if process_alive(state.get("supervisor_pid"), state.get("supervisor_create_time")):
            return status
        handle = RunHandle.from_state(state)
        address = handle.ref.get("address") if handle else state.get("ray_address")
        job_id = handle.ref.get("job_id") if handle else state.get("ray_job_id")
        if not job_id or not address:
            return "lost"
        js = job_status(address, job_id)
        if js is None:
            return "lost"
        catch_up_logs(run_dir, state)
        if js in TERMINAL:
            outcome = "stopped" if state.get("stop_requested_at") else TERMINAL[js]
            write_state(run_dir, status=outcome, ended_at=time.time(), ray_job_status=js,
                        exit_code={"finished": 0}.get(TERMINAL[js], state.get("exit_code")))
            return outcome
        return "running"

    def stop_plan(self, run_dir: Path, state: dict[str, Any], grace: float) -> str:
        return (f"would stop Ray job {state.get('ray_job_id', '?')} at {state.get('ray_address', '?')} "
                f"({run_dir.name}), waiting up to {grace:g} s.")

    def stop(self, run_dir: Path, state: dict[str, Any], grace: float) -> str:
        if process_alive(state.get("supervisor_pid"), state.get("supervisor_create_time")):
            os.kill(state["supervisor_pid"], signal.SIGTERM)
            deadline = time.time() + grace + 60
            while time.time() < deadline and read_state(run_dir).get("status") in ACTIVE:
                time.sleep(0.2)
            return f"{run_dir.name}: {read_state(run_dir).get('status')}"
        handle = RunHandle.from_state(state)
        address = handle.ref.get("address") if handle else state.get("ray_address")
        job_id = handle.ref.get("job_id") if handle else state.get("ray_job_id")
        if job_id and address:
            write_state(run_dir, status="stopping", stop_requested_at=time.time())
            stop_job_rest(address, job_id)
            deadline = time.time() + grace
            while time.time() < deadline and job_status(address, job_id) not in TERMINAL:
                time.sleep(0.5)
            catch_up_logs(run_dir, state)
        if state.get("ray_started_head") and not state.get("ray_head_stopped"):
            stop_head(state.get("ray_head_pid"), state.get("ray_head_temp_dir"))
            write_state(run_dir, ray_head_stopped=True)
        write_state(run_dir, status="stopped", ended_at=time.time())
        return f"{run_dir.name}: stopped"

    def catch_up_logs(self, run_dir: Path, state: dict[str, Any]) -> None:
        catch_up_logs(run_dir, state)


def stop_ray_job(run_dir: Path, state: dict[str, Any], grace: float = 60.0) -> str:
    return RayExecutor().stop(run_dir, state, grace)


def main(argv: list[str] | None = None) -> int:
    """`python -m rlctl.executors.ray RUN_DIR`: the generic supervisor entry point."""
    from rlctl.runs.supervisor import main as supervise

    return supervise(argv)


if __name__ == "__main__":
    sys.exit(main())
