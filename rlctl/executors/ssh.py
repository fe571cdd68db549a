"""The SSH executor: runs on the user's own GPU boxes, reached with the system ssh (see ssh_runner.py).

A remote run runs under the REMOTE rlctl (`<host python> -m rlctl.cli remote-launch`, which calls `rlctl launch
--detach` there): the supervisor, restarts, stall detection and NVML sampling live on the host, and the run survives
the SSH connection, the laptop sleeping, or this rlctl being killed. The laptop keeps a run directory of the same
name whose state.json holds the handle {host, run_dir (remote)} and a mirror of the remote log and metrics
(rsync, pulled when a command looks), so status, logs, metrics, doctor and ckpt list work locally.

Launch: everything the recipe references (the extends chain, reward file, data files and eval sets' data, a
local model or patch directory) is sent content-addressed (sha256-named blobs; only missing ones travel), a git
bundle when the recipe's repository has commits no remote branch holds; the remote side checks every hash (and the
commit) before starting.
Secrets travel in the JSON request on the remote process's stdin, never on a command line or in a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from rlctl.core.host import Host, get_host
from rlctl.core.state import ACTIVE, read_state, write_state
from rlctl.errors import CheckFailed, RlctlError
from rlctl.executors.base import Executor
from rlctl.executors.ssh_relay import relay
from rlctl.executors.ssh_remote import BLOBS, sha256_file
from rlctl.executors.ssh_runner import HostUnreachable, Runner, call_remote, local_version, remote_rlctl_error
from rlctl.recipe.paths import script_words  # an eval command's own scripts

MIRROR = ("stdout.log", "metrics.jsonl", ".ingest.json", "backend_metrics.jsonl", "env.json", "recipe.toml",
          "supervisor.log", "gpu_memory.jsonl")
FORWARD = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # sent when set here, besides the recipe's refs
# what this side keeps of the host's state.json: status shows it as it shows a local run's (the evals' outcome too)
STATE_KEYS = ("status", "exit_code", "started_at", "ended_at", "total_steps", "optimizer_steps", "backend", "version",
              "attempts", "restart", "gave_up", "disk_full", "error", "wandb_run_id", "preflight", "cause",
              "eval_failures", "best_checkpoint", "stopped_by")


# ---- facts -------------------------------------------------------------------------------------------------------
def host_facts(host: Host, timeout: float = 30.0) -> dict[str, Any]:
    """The host's MachineFacts as a dict, in one round trip; a missing or older rlctl is a clear error."""
    from rlctl.core.facts import MachineFacts

    r = Runner(host, connect_timeout=min(timeout, 10))
    p = r.rlctl(["facts", "--json", "--path", host.workdir], timeout=timeout, check=False)
    if p.returncode != 0:
        err = remote_rlctl_error(host, p)
        if err is None and "No such command" in (p.stderr + p.stdout):
            err = RlctlError(f"{host.name}: its rlctl has no `facts` command (older than {local_version()}).",
                             hint=f"rlctl hosts install {host.name}")
        raise err or RlctlError(f"{host.name}: rlctl facts failed: {(p.stderr or p.stdout).strip()[-300:]}")
    try:
        facts = MachineFacts.from_dict(json.loads(p.stdout.strip().splitlines()[-1])).to_dict()
    except (ValueError, IndexError, TypeError):
        raise RlctlError(f"{host.name}: rlctl facts answered {p.stdout.strip()[-200:]!r}, not JSON.") from None
    if _older(facts["rlctl_version"], local_version()):
        raise RlctlError(f"{host.name}: rlctl {facts['rlctl_version']} there is older than {local_version()} here.",
                         hint=f"rlctl hosts install {host.name}")
    return facts


def _older(theirs: str, ours: str) -> bool:
    def key(v: str) -> tuple[int, ...]:
        out = []
        for part in v.split("+")[0].split("."):
            digits = "".join(ch for ch in part if ch.isdigit())
            out.append(int(digits) if digits else 0)
        return tuple(out)

    try:
        return key(theirs) < key(ours)
    except ValueError:
        return True


# ---- launch ------------------------------------------------------------------------------------------------------
def _path_values(prep: Any) -> list[tuple[str, str]]:
    """(dotted key, absolute path) of each recipe key that names a local path, as the loader resolved it
    (rlctl.recipe.paths), each eval set's data included (its checkpoint evals run on the host). A backend's own
    install (`backend.<name>.checkout`) lives on the host, as its Python does: it is not staged."""
    import re

    from rlctl.recipe.paths import local_paths

    return [(k, v) for k, v in local_paths(prep.resolved.data) if not k.startswith("backend.")
            and re.fullmatch(r"[A-Za-z0-9_.]+", k)]  # --set takes plain key parts


def _script_values(prep: Any) -> list[tuple[str, str]]:
    """(command key, absolute path) of each local script a command key names (eval.command's eval script): the
    host's run evaluates with the copy sent, not the laptop's path (rlctl.recipe.paths)."""
    from rlctl.recipe.paths import command_scripts

    return [(k, v) for k, v in command_scripts(prep.resolved.data) if Path(v).is_file()]


def _keep_laptop_recipe(local: Path, prep: Any) -> None:
    """The recipe as the laptop resolved it (its own paths, not the host's staged copies that recipe.toml mirrors):
    what a comparison with the laptop's other runs reads (rlctl.experiments.report), secrets masked."""
    from rlctl.core.state import HERE_RECIPE
    from rlctl.recipe.loader import dump_toml
    from rlctl.runs.rundir import masked_recipe_data

    with contextlib.suppress(Exception):  # a record for comparisons: never a reason the launch fails
        data = masked_recipe_data(prep.recipe.model_dump(mode="json", exclude_none=True))
        (local / HERE_RECIPE).write_text(dump_toml(data))


def referenced_files(prep: Any) -> list[Path]:
    """Every local file the recipe needs: its extends chain, and what its path keys name (files, or all files of a
    named directory), the scripts its commands name included."""
    files: list[Path] = [Path(p) for p in prep.resolved.chain]
    for _, value in _path_values(prep) + _script_values(prep):
        p = Path(value)
        if p.is_file():
            files.append(p.resolve())
        elif p.is_dir():
            files += sorted(x.resolve() for x in p.rglob("*") if x.is_file() and ".git" not in x.parts)
    seen: dict[Path, None] = {}
    for f in files:
        seen.setdefault(f.resolve(), None)
    return list(seen)


def path_keys(prep: Any, base: Path) -> dict[str, str]:
    """Each path key that names a local file or directory, as a path relative to the staged tree: the remote side
    sets it to its own copy (an absolute path on the laptop means nothing there)."""
    out = {}
    for key, value in _path_values(prep):
        p = Path(value)
        if p.exists():
            with contextlib.suppress(ValueError):
                out[key] = str(p.resolve().relative_to(base))
    return out


def command_keys(prep: Any, base: Path) -> dict[str, list[Any]]:
    """Each command key that names a local script, as its words, the script given as {"staged": path relative to
    the staged tree}: the remote side puts its own copy's path there."""
    import shlex

    scripts = {v for _, v in _script_values(prep)}
    out: dict[str, list[Any]] = {}
    for key in {k for k, _ in _script_values(prep)}:
        table: Any = prep.resolved.data
        for part in key.split("."):
            table = table[part]
        out[key] = [{"staged": str(Path(w).resolve().relative_to(base))} if w in scripts else w
                    for w in shlex.split(table)]
    return out


def secrets_to_send(prep: Any) -> dict[str, str]:
    from rlctl.runs.rundir import SECRET_REF
    from rlctl.runs.store import store_env_names

    names = {m.group(1) for v in prep.plan.env.values() if (m := SECRET_REF.match(str(v)))}
    names |= {n for n in FORWARD if n in os.environ}
    names |= set(store_env_names(prep.recipe.checkpoint.sync))  # the run's sync store, reached from there
    names |= {n.strip() for n in os.environ.get("RLCTL_FORWARD_ENV", "").split(",") if n.strip()}
    missing = sorted(n for n in names if n not in os.environ)
    if missing:
        raise RlctlError(f"the run needs {', '.join(missing)} in the environment and it is not set.",
                         hint=f"export {missing[0]}=... (rlctl sends it to the remote process, never to a file)")
    return {n: os.environ[n] for n in sorted(names)}


def git_bundle(recipe_path: Path, tmp: Path) -> tuple[dict[str, Any], Path] | None:
    """When the recipe lives in a git repository whose HEAD no remote branch holds: a bundle of HEAD's files, as one
    commit without parents (HEAD's tree, dates and message line: the same bundle each time, so it travels once). The
    host needs the code at HEAD, not the history: a repository whose past holds large files sent whole filled small
    disks. Made in a repository of its own under `tmp` that borrows the user's objects: the user's is not written."""
    def git(*a: str, cwd: Path = recipe_path.parent, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(cwd), *a], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **(env or {})})

    try:
        head = git("rev-parse", "HEAD")
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    sha = head.stdout.strip()
    pushed = git("branch", "-r", "--contains", sha)
    if pushed.returncode == 0 and pushed.stdout.strip():
        return None  # the host can fetch it; the referenced files travel anyway
    tree = git("rev-parse", "HEAD^{tree}").stdout.strip()
    objects = Path(git("rev-parse", "--path-format=absolute", "--git-common-dir").stdout.strip()) / "objects"
    when = git("log", "-1", "--format=%cI").stdout.strip()
    snap = tmp / "snapshot"
    if git("init", "-q", str(snap), cwd=tmp).returncode != 0 or not tree or not objects.is_dir():
        return None
    (snap / ".git" / "objects" / "info" / "alternates").write_text(f"{objects}\n")
    who = {"GIT_AUTHOR_NAME": "rlctl", "GIT_AUTHOR_EMAIL": "rlctl@localhost", "GIT_COMMITTER_NAME": "rlctl",
           "GIT_COMMITTER_EMAIL": "rlctl@localhost", "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
    commit = git("commit-tree", tree, "-m", f"rlctl: the files of {sha}", cwd=snap, env=who).stdout.strip()
    if not commit or git("update-ref", "refs/heads/rlctl-snapshot", commit, cwd=snap).returncode != 0:
        return None
    bundle = tmp / "code.bundle"
    if git("bundle", "create", str(bundle), "rlctl-snapshot", cwd=snap).returncode != 0:
        return None
    return {"sha": sha, "tree": tree, "commit": commit}, bundle


def send_blobs(runner: Runner, files: dict[str, Path], timeout: float) -> None:
    """rsync the blobs the host lacks into <workdir>/.rlctl/blobs (named by sha256; resumable)."""
    answer = call_remote(runner, "blobs", {"sha256": sorted(files)}, timeout=timeout)
    missing = [s for s in answer.get("missing", []) if s in files]
    if not missing:
        return
    with tempfile.TemporaryDirectory(prefix="rlctl-blobs-") as tmp:
        for s in missing:
            os.symlink(files[s], Path(tmp) / s)
        runner.rsync([f"{tmp}/"], BLOBS + "/", up=True, extra=["-L", "--partial", "--partial-dir=.partial"],
                     timeout=max(timeout, 3600))


def launch_remote(opts: Any, host_name: str, out: Any = None, *, prep: Any = None, pool: dict[str, Any] | None = None,
                  lineage: dict[str, Any] | None = None) -> tuple[Path, int]:
    """`rlctl launch RECIPE --on HOST`: send what the recipe references, start it there detached under the remote
    rlctl, keep a local record of the same name. Attached (no --detach): follow its log until it ends. A pool run
    (rlctl.executors.ssh_pool) also keeps its pool, the request (to start it elsewhere later, with the same inputs:
    copies of them in the record) and its first attempt's lineage entry."""
    from rlctl.recipe.planning import prepare
    from rlctl.runs.state import runs_root

    out = out or sys.stderr
    host = get_host(host_name)
    prep = prep or prepare(opts.recipe, opts.sets)
    files = referenced_files(prep)
    base = Path(os.path.commonpath([str(f.parent) for f in files]))
    shas = {sha256_file(f): f for f in files}
    manifest = {str(f.relative_to(base)): sha256_file(f) for f in files}
    env = secrets_to_send(prep)
    runner = Runner(host)
    resume = _resume_on(host, opts.resume, out)
    request: dict[str, Any] = {
        "token": f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}", "manifest": manifest,
        "recipe": str(prep.resolved.path.relative_to(base)), "env": env, "paths": path_keys(prep, base),
        "commands": command_keys(prep, base), "host": host.name,
        "options": {"sets": list(opts.sets), "smoke": opts.smoke, "name": opts.name or prep.recipe.name,
                    "force": opts.force, "resume": resume, "grace": opts.grace_seconds, "restart": opts.restart,
                    "max_restarts": opts.max_restarts, "executor": opts.executor, "placement": opts.placement,
                    **({"lineage": lineage} if lineage else {})}}
    inputs = None
    with tempfile.TemporaryDirectory(prefix="rlctl-git-") as tmp:
        bundled = git_bundle(prep.resolved.path, Path(tmp))
        if bundled:
            meta, bundle = bundled
            meta["bundle_sha256"] = sha256_file(bundle)
            shas[meta["bundle_sha256"]] = bundle
            request["git"] = meta
        print(f"rlctl: sending {len(shas)} file(s) to {host.name} (only those it lacks travel)", file=out)
        send_blobs(runner, shas, timeout=60)
        if pool is not None:
            from rlctl.executors.ssh_inputs import keep_inputs

            inputs = keep_inputs(shas, runs_root(), request["token"])
    print(f"rlctl: preflight and start on {host.name} (its GPUs, disk and backend)", file=out)
    try:
        answer = call_remote(runner, "launch", request, timeout=600)
    except HostUnreachable as e:  # the host may have started the run before the answer was lost: not "try again"
        raise CheckFailed(f"{e.message} (while starting the run there: it may have started on {host.name})",
                          hint=f"rlctl hosts check {host.name}; its runs are under {host.workdir}/runs") from None
    name = answer["name"]
    local = runs_root() / name
    local.mkdir(parents=True, exist_ok=False)
    remote_state = answer.get("state") or {}
    write_state(local, name=name, executor="ssh", host=host.name,
                handle={"executor": "ssh", "ref": {"host": host.name, "run_dir": answer["run_dir"]}, "attempt": 1},
                recipe=str(prep.resolved.path), remote_run_dir=answer["run_dir"], git_sha=answer.get("git_sha"),
                last_contact=time.time(), **{k: remote_state[k] for k in STATE_KEYS if k in remote_state})
    _keep_laptop_recipe(local, prep)
    if pool is not None:
        from rlctl.executors.ssh_inputs import record_pool

        record_pool(local, pool, request, shas, env, inputs, host.name, answer, lineage or {})
    with contextlib.suppress(RlctlError):
        mirror(local, runner, answer["run_dir"])
    print(f"rlctl: {name} runs on {host.name} in {answer['run_dir']}", file=out)
    if opts.detach:
        return local.resolve(), 0
    from rlctl.runs.logs import show_logs

    show_logs(local, follow=True)
    st = read_state(local)
    by = st.get("stopped_by") if isinstance(st.get("stopped_by"), dict) else None
    if by:  # stopped by the recipe's own stop_when: it ended as asked
        print(f"rlctl: {name} stopped by stop_when {by.get('rule')}: {by.get('message')}", file=out)
    return local.resolve(), 0 if st.get("status") == "finished" or by else 1


def _resume_on(host: Host, resume: str | None, out: Any) -> str | None:
    """--resume RUN or HOST:RUN for a run on `host`: the name of a run record there that holds the checkpoint (the
    run itself when it ran there; else its newest complete checkpoint is pushed there first)."""
    if not resume or "://" in resume:
        return resume
    from rlctl.runs.state import find_run

    src_host, _, name = resume.rpartition(":")
    try:
        local = find_run(name)
    except RlctlError:
        if src_host in ("", host.name):
            return name  # a run that only that host knows
        raise
    st = read_state(local)
    if src_host and src_host != (st.get("host") or "local"):
        raise RlctlError(f"--resume {resume}: {local.name} ran on {st.get('host') or 'this machine'}, not {src_host}.")
    if st.get("host") == host.name:
        return Path(((st.get("handle") or {}).get("ref") or {}).get("run_dir") or local.name).name
    print(f"rlctl: copying the newest complete checkpoint of {local.name} to {host.name}", file=out)
    try:
        print("rlctl: " + ckpt_push(local, None, host.name), file=out)
    except HostUnreachable as e:
        lost = st.get("executor") == "ssh" and str(e.message).startswith(f"{st.get('host')}:")
        synced = _synced_instead(local, e, out) if lost else None  # its host is gone: from what it synced
        if synced is None:
            raise
        return synced
    return local.name


def _synced_instead(local: Path, e: HostUnreachable, out: Any) -> str | None:
    """A run whose host is lost resumes from the newest checkpoint it synced (`checkpoint.sync`): that URL, once
    it holds a complete one; else None."""
    import tomllib

    from rlctl.runs.sync import read_latest

    try:
        url = tomllib.loads((local / "recipe.toml").read_text()).get("checkpoint", {}).get("sync")
    except (OSError, ValueError):
        return None
    if not isinstance(url, str) or not url:
        return None
    try:
        latest = read_latest(url)
    except Exception as why:  # no fsspec/s3fs here, no credentials: say so, keep the host's error
        print(f"rlctl: {local.name} synced its checkpoints to {url}, which cannot be read from here ({why})",
              file=out)
        return None
    if latest is None:
        print(f"rlctl: {local.name} synced no complete checkpoint to {url}", file=out)
        return None
    print(f"rlctl: {e.message}", file=out)
    print(f"rlctl: resuming from step {latest['step']} of {local.name}, synced to {url}", file=out)
    return url


# ---- following a remote run ---------------------------------------------------------------------------------------
def _handle(state: dict[str, Any]) -> tuple[Host, str]:
    ref = (state.get("handle") or {}).get("ref") or {}
    if not ref.get("host") or not ref.get("run_dir"):
        raise RlctlError("this run's state.json has no SSH handle {host, run_dir}.")
    return get_host(ref["host"]), ref["run_dir"]


def mirror(run_dir: Path, runner: Runner, remote_dir: str, timeout: float = 60.0) -> None:
    """Pull the remote run's log, metrics and small records into the local run directory (rsync: only what changed)."""
    # --copy-links: an attached run's stdout.log links to the trainer's log there; here it is that log's content.
    # evals/evals.json: the run's eval ledger lives where the run does (by-hand evals there, in place or from
    # another host, are recorded in it): status here reads the copy
    extra = ["--copy-links", *(f"--include=/{n}" for n in MIRROR), "--include=/attempts/***", "--include=/evals/",
             "--include=/evals/evals.json", "--exclude=*"]
    runner.rsync([remote_dir.rstrip("/") + "/"], str(run_dir) + "/", up=False, extra=extra, timeout=timeout)


def record(run_dir: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """Fold a poll answer into the local state.json; returns the summary row (or {} on an error)."""
    if "error" in entry:
        write_state(run_dir, remote_error=entry["error"], last_contact=time.time())
        return {}
    st = entry.get("state") or {}
    summ = entry.get("summary") or {}
    updates = {k: st[k] for k in STATE_KEYS if k in st}
    here = read_state(run_dir)
    if isinstance(here.get("lineage"), list) and isinstance(here.get("started_at"), (int, float)):
        # a pool run began with its first attempt, wherever that ran: its elapsed time counts from there
        updates.pop("started_at", None)
        if summ.get("elapsed_s") is not None:
            end = st.get("ended_at") if summ.get("status") not in ACTIVE + ("stalled",) else None
            summ = {**summ, "elapsed_s": (end if isinstance(end, (int, float)) else time.time()) - here["started_at"]}
    if summ.get("status") and summ["status"] not in ACTIVE + ("stalled", "lost"):
        updates["status"] = summ["status"]  # settled there (finished, failed, stopped); stalled/lost: keep asking
    if isinstance(summ.get("cause"), dict):  # why it failed, told there (when its disk let nothing be written)
        updates["cause"] = summ["cause"]
    write_state(run_dir, **updates, remote_summary=summ, last_contact=time.time(), unreachable=None)
    return summ


def poll_many(run_dirs: list[Path], timeout: float = 5.0, stall_after: float = 1800.0
              ) -> dict[Path, dict[str, Any]]:
    """One round trip per host, hosts in parallel: each remote run's summary row, or {"status": "unreachable"}
    with its last known state. Never waits longer than about `timeout`."""
    from concurrent.futures import ThreadPoolExecutor

    by_host: dict[str, list[tuple[Path, str]]] = {}
    rows: dict[Path, dict[str, Any]] = {}
    for d in run_dirs:
        ref = (read_state(d).get("handle") or {}).get("ref") or {}
        if ref.get("host") and ref.get("run_dir"):
            by_host.setdefault(ref["host"], []).append((d, ref["run_dir"]))

    def one(host_name: str) -> None:
        runs = by_host[host_name]
        try:
            host = get_host(host_name)
            r = Runner(host, connect_timeout=timeout)
            answer = call_remote(r, "poll", {"run_dirs": [rd for _, rd in runs], "stall_after": stall_after},
                                 timeout=timeout)
            for d, rd in runs:
                before = read_state(d).get("status")
                rows[d] = record(d, answer.get(rd) or {"error": "no answer for this run"})
                after = read_state(d).get("status")
                if after != before and after not in ACTIVE + ("stalled", "lost"):
                    # seen ending here: its log and metrics come once, so `status RUN` and `logs RUN` show the end
                    with contextlib.suppress(RlctlError):
                        mirror(d, r, rd)
        except RlctlError as e:
            for d, _ in runs:
                write_state(d, unreachable=e.message)
                rows[d] = {"status": "unreachable", "error": e.message}

    with ThreadPoolExecutor(max_workers=max(1, len(by_host))) as pool:
        list(pool.map(one, list(by_host)))
    return rows


class SSHExecutor(Executor):
    """Runs live on an SSH host under its own rlctl; this side polls, mirrors and stops them. (Registered as "ssh"
    with its pools: rlctl.executors.ssh_pool.SSHPoolExecutor.)"""

    name: ClassVar[str] = "ssh"
    remote: ClassVar[bool] = True
    mirrored: ClassVar[bool] = True  # the host's rlctl parses the log; mirror() brings its metrics.jsonl
    timeout: ClassVar[float] = float(os.environ.get("RLCTL_SSH_TIMEOUT", "10"))

    def launch(self, opts: Any, host_name: str, out: Any = None) -> tuple[Path, int]:
        return launch_remote(opts, host_name, out)

    # the verbs the CLI asks for through the registry (the core names no executor module)
    host_facts = staticmethod(lambda host, timeout=30.0: host_facts(host, timeout))
    remote_checkpoints = staticmethod(lambda run_dir, step=None, list_only=False:
                                      remote_checkpoints(run_dir, step, list_only=list_only))
    ckpt_pull = staticmethod(lambda run_dir, step, to: ckpt_pull(run_dir, step, to))
    ckpt_push = staticmethod(lambda run_dir, step, host_name: ckpt_push(run_dir, step, host_name))
    run_remote_rlctl = staticmethod(lambda host_name, args, sync_dir=None: run_remote_rlctl(host_name, args, sync_dir))
    attach_remote = staticmethod(lambda host_name, path, backend, name, **kw: attach_remote(host_name, path, backend,
                                                                                           name, **kw))
    eval_on = staticmethod(lambda host_name, ev, steps, **kw: eval_on(host_name, ev, steps, **kw))

    @staticmethod
    def install(host: Host, spec: str, timeout: float = 1800.0) -> subprocess.CompletedProcess[str]:
        """pip-install `spec` with the host's python (`rlctl hosts install`)."""
        r = Runner(host)
        return r.run([*r.python_argv(), "-m", "pip", "install", spec], timeout=timeout, check=False)

    def poll_many(self, run_dirs: list[Path], timeout: float = 5.0, stall_after: float = 1800.0
                  ) -> dict[Path, dict[str, Any]]:
        return poll_many(run_dirs, timeout, stall_after)

    def status(self, run_dir: Path, state: dict[str, Any]) -> str:
        try:
            host, remote_dir = _handle(state)
            runner = Runner(host, connect_timeout=self.timeout)
            answer = call_remote(runner, "poll", {"run_dirs": [remote_dir]}, timeout=self.timeout)
            summ = record(run_dir, answer.get(remote_dir) or {"error": "no answer"})
            mirror(run_dir, runner, remote_dir, timeout=max(self.timeout, 30))
        except RlctlError as e:
            write_state(run_dir, unreachable=e.message)
            return "unreachable"
        return str(summ.get("status") or read_state(run_dir).get("status", "unknown"))

    def catch_up_logs(self, run_dir: Path, state: dict[str, Any]) -> None:
        self.status(run_dir, state)

    def stop(self, run_dir: Path, state: dict[str, Any], grace: float) -> str:
        host, remote_dir = _handle(state)
        runner = Runner(host, connect_timeout=self.timeout)
        p = runner.rlctl(["stop", remote_dir, "--grace", f"{grace:g}"], timeout=grace + 60, check=False)
        if p.returncode != 0:
            raise remote_rlctl_error(host, p) or RlctlError(f"{host.name}: stop failed: "
                                                           f"{(p.stderr or p.stdout).strip()[-300:]}")
        self.status(run_dir, read_state(run_dir))
        return f"{host.name}: {p.stdout.strip()}"

    def resume_there(self, run_dir: Path, state: dict[str, Any]) -> str | None:
        """The host's own rlctl resumes the run there (its supervisor lives there), as stop does."""
        host, remote_dir = _handle(state)
        runner = Runner(host, connect_timeout=self.timeout)
        p = runner.rlctl(["resume", remote_dir], timeout=300, check=False)
        if p.returncode != 0:
            raise remote_rlctl_error(host, p) or RlctlError(f"{host.name}: resume failed: "
                                                           f"{(p.stderr or p.stdout).strip()[-300:]}")
        self.status(run_dir, read_state(run_dir))
        return f"{host.name}: {p.stdout.strip()}"

    def supervised_on(self, state: dict[str, Any]) -> tuple[str, str] | None:
        host, remote_dir = _handle(state)
        return host.name, remote_dir

    def path_here(self, run_dir: Path, state: dict[str, Any], path: str, host: str | None = None) -> str:
        """The mirror's copy of a file under the run's directory on its host once it was synced here, else HOST:PATH
        (as `ckpt list` names a checkpoint on a host): the host's path alone reads as a path of this machine."""
        ref = (state.get("handle") or {}).get("ref") or {}
        remote_dir = ref.get("run_dir") or state.get("remote_run_dir")
        if isinstance(remote_dir, str) and (host is None or host == ref.get("host")):
            with contextlib.suppress(ValueError):
                copy = run_dir / PurePosixPath(path).relative_to(remote_dir)
                if copy.is_file():
                    return str(copy)
        host = host or ref.get("host") or state.get("host")
        return f"{host}:{path}" if host else path

    def stop_plan(self, run_dir: Path, state: dict[str, Any], grace: float) -> str:
        host, remote_dir = _handle(state)
        return (f"would run `rlctl stop {remote_dir} --grace {grace:g}` on {host.name}: SIGTERM to the run's process "
                f"group there, SIGKILL after {grace:g} s.")

    def poll(self, run_dir: Path, handle: Any) -> int | None:
        st = read_state(run_dir)
        if self.status(run_dir, st) in ACTIVE + ("unreachable",):
            return None
        return read_state(run_dir).get("exit_code")


def run_remote_rlctl(host_name: str, args: list[str], sync_dir: Path | None = None, timeout: float = 1800.0
                     ) -> tuple[int, str, str]:
    """The host's rlctl with these arguments (e.g. `patch apply ...`): (exit code, stdout, stderr). A local
    directory given as `sync_dir` is copied there first and `--dir` points at the copy."""
    host = get_host(host_name)
    runner = Runner(host)
    if sync_dir is not None:
        from rlctl.executors.ssh_runner import sync_to

        if not sync_dir.is_dir():
            raise RlctlError(f"--dir {sync_dir}: not a directory.")
        dest = f".rlctl/dirs/{sync_dir.resolve().name}"
        sync_to(host, [sync_dir.resolve()], ".rlctl/dirs")
        args = [*args, "--dir", dest]
    p = runner.rlctl(args, timeout=timeout, check=False)
    err = remote_rlctl_error(host, p)
    if err:
        raise err
    return p.returncode, p.stdout.rstrip("\n"), p.stderr


def attach_remote(host_name: str, path: str, backend: str, name: str | None, out: Any = None,
                  recipe: str | None = None, metrics_map: str | None = None) -> tuple[str, int, Path]:
    """`rlctl attach HOST:PATH [--recipe R] [--metrics-map M]`: the host's rlctl makes the run directory there (for a
    run rlctl did not start), with the recipe (its extends chain sent content-addressed) read as a local attach
    reads it; this side keeps a local record of the same name, followed like any remote run."""
    import re

    from rlctl.runs.state import runs_root

    host = get_host(host_name)
    runner = Runner(host)
    args = ["attach", path, "--backend", backend, *(["--name", name] if name else []),
            *(["--metrics-map", metrics_map] if metrics_map else [])]
    if recipe is not None:
        args += ["--recipe", _stage_recipe(runner, recipe)]
    p = runner.rlctl(args, timeout=600, check=False)
    err = remote_rlctl_error(host, p)
    if err:
        raise err
    m = re.search(r"^attached (\S+) \(", p.stdout, re.M)
    if not m:
        raise RlctlError(f"{host.name}: " + ((p.stderr or p.stdout).strip().removeprefix("rlctl: ")
                                             or f"attach failed (exit {p.returncode})"))
    remote_dir = runner.abs(m.group(1))
    local = runs_root() / Path(remote_dir).name
    local.mkdir(parents=True, exist_ok=False)
    write_state(local, name=local.name, executor="ssh", host=host.name, status="attached", started_at=time.time(),
                handle={"executor": "ssh", "ref": {"host": host.name, "run_dir": remote_dir}, "attempt": 1},
                remote_run_dir=remote_dir)
    answer = call_remote(runner, "poll", {"run_dirs": [remote_dir]}, timeout=60)
    record(local, answer.get(remote_dir) or {"error": "no answer"})
    with contextlib.suppress(RlctlError):
        mirror(local, runner, remote_dir)
    return f"{host.name}: {p.stdout.strip()}\nlocal record: {local}", p.returncode, local


def _stage_recipe(runner: Runner, recipe: str) -> str:
    """A recipe and its extends chain on the host, laid out as here (content-addressed: only what it lacks travels);
    the path of the recipe there."""
    from rlctl.recipe.loader import load

    resolved = load(recipe)
    manifest, staged, blobs = stage_manifest([Path(p) for p in resolved.chain])
    send_blobs(runner, blobs, timeout=60)
    token = "recipe-" + hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:20]
    stage = call_remote(runner, "stage", {"manifest": manifest, "token": token}, timeout=120)["stage"]
    return f"{stage}/{staged[str(resolved.path)]}"


# ---- checkpoints --------------------------------------------------------------------------------------------------
def remote_checkpoints(run_dir: Path, step: int | None = None, timeout: float = 600.0, list_only: bool = False
                       ) -> tuple[Runner, dict]:
    """The remote run's checkpoints; unless list_only, the picked one's files with sizes and sha256."""
    state = read_state(run_dir)
    host, remote_dir = _handle(state)
    runner = Runner(host)
    return runner, call_remote(runner, "ckpt", {"run_dir": remote_dir, "step": step, "list": list_only},
                               timeout=timeout)


def verify(root: Path, files: list[dict[str, Any]]) -> list[str]:
    bad = []
    for f in files:
        p = root / f["rel"]
        if not p.is_file() or p.stat().st_size != f["size"] or sha256_file(p) != f["sha256"]:
            bad.append(f["rel"])
    return bad


def ckpt_pull(run_dir: Path, step: int | None, to: Path | None, out: Any = None) -> tuple[Path, dict[str, Any]]:
    """Copy one complete checkpoint of a remote run here (rsync --partial: a broken transfer resumes), then check
    every file's size and sha256. Default destination: the local run directory's checkpoint root."""
    from rlctl.runs.checkpoints import checkpoint_dir

    runner, answer = remote_checkpoints(run_dir, step)
    pick = answer.get("pick")
    if not pick:
        raise RlctlError(f"{run_dir.name}: no complete checkpoint on {runner.host.name}"
                         + (f" at step {step}" if step is not None else "") + ".",
                         hint=f"rlctl ckpt list {run_dir.name}")
    dest = (to or checkpoint_dir(run_dir)).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    root = answer["root"].rstrip("/")
    sources = [f"{root}/./{t}" for t in pick["tops"]]
    runner.rsync(sources, str(dest) + "/", up=False, extra=["--relative", "--partial", "--partial-dir=.rsync-partial"])
    bad = verify(dest, pick["files"])
    if bad:
        raise RlctlError(f"{len(bad)} pulled file(s) differ from {runner.host.name}'s: {', '.join(bad[:3])}.",
                         hint="run the pull again: it resumes")
    return dest, pick


def ckpt_push(run_dir: Path, step: int | None, host_name: str, out: Any = None) -> str:
    """Copy one complete checkpoint of a run (local, or on another host: from there directly when it reaches this
    one, else through here) to a host, as a run record there of the same name: `rlctl launch RECIPE --on HOST
    --resume RUN` then resumes from it."""
    from rlctl.runs.checkpoints import find_checkpoints
    from rlctl.runs.state import read_state as rs

    state = rs(run_dir)
    host = get_host(host_name)
    if state.get("executor") == "ssh":
        where, remote_dir = _handle(state)
        src = Runner(where)
        answer = call_remote(src, "ckpt", {"run_dir": remote_dir, "step": step, "list": where.name == host.name},
                             timeout=600)
        done = [c for c in answer.get("checkpoints") or [] if c.get("complete") and c.get("step") is not None
                and (step is None or c["step"] == step)]
        if where.name == host.name:  # its own host: nothing to copy (a record pushed over the run would replace it)
            if not done:
                raise RlctlError(f"{run_dir.name}: no complete checkpoint on {where.name}"
                                 + (f" at step {step}" if step is not None else "") + ".",
                                 hint=f"rlctl ckpt list {run_dir.name}")
            return (f"step {done[-1]['step']} of {run_dir.name} is on {host.name} already (the run lives there: "
                    f"rlctl launch RECIPE --on {host.name} --resume {run_dir.name} resumes from it)")
        if where.name != host.name:  # host to host (through here only when they do not reach each other)
            if not answer.get("pick"):
                raise RlctlError(f"{run_dir.name}: no complete checkpoint on {where.name}"
                                 + (f" at step {step}" if step is not None else "") + ".",
                                 hint=f"rlctl ckpt list {run_dir.name}")
            n, route = relay_checkpoints(src, Runner(host), run_dir.name, {**answer, "picks": [answer["pick"]]}, out)
            how = {"already there": "already there", "directly": f"copied from {where.name} directly"}.get(
                route, f"copied from {where.name} {route}")
            return f"step {answer['pick']['step']} of {run_dir.name} is on {host.name} ({n} files, {how}, verified)"
        ckpt_pull(run_dir, step, None)
    backend = state.get("backend", "")
    ckpts = [c for c in find_checkpoints(backend, run_dir) if c.complete and (step is None or c.step == step)]
    if not ckpts:
        raise RlctlError(f"{run_dir.name}: no complete checkpoint" + (f" at step {step}" if step is not None else "")
                         + ".", hint=f"rlctl ckpt list {run_dir.name}")
    pick = ckpts[-1]
    n, _ = push_checkpoints(run_dir, [pick], Runner(host))
    return f"step {pick.step} of {run_dir.name} is on {host.name} ({n} files, verified)"


def push_checkpoints(run_dir: Path, picks: list[Any], runner: Runner, eval_only: bool = False,
                     as_name: str | None = None) -> tuple[int, bool]:
    """Copy these complete checkpoints of a local run to the host as a run record of the same name
    (<workdir>/runs/<name>/checkpoints), resumably (rsync --partial), every file's size and sha256 checked there.
    Files already there and intact are not sent again. With eval_only, only what an evaluator loads travels (the
    HF model or adapter directory, e.g. OpenRLHF's global_stepN_hf without its DeepSpeed state). (number of files,
    whether anything travelled)."""
    from rlctl.evals.loop import model_dir
    from rlctl.runs.checkpoints import checkpoint_dir
    from rlctl.runs.state import read_state as rs

    state = rs(run_dir)
    backend = state.get("backend", "")
    root = checkpoint_dir(run_dir).resolve()
    tops, files = [], []
    from rlctl.runs.checkpoints import root_markers

    markers = [] if eval_only else root_markers(root)  # what a resume there reads besides the checkpoint
    for pick, extra in zip(picks, [markers] + [[]] * (len(picks) - 1), strict=True):
        for t in [Path(model_dir(pick))] if eval_only else [*pick.paths(), *extra]:
            rel = t.resolve().relative_to(root)
            tops.append(str(rel))
            items = [t] if t.is_file() else sorted(x for x in t.rglob("*") if x.is_file() and not x.is_symlink())
            files += [{"rel": str(x.resolve().relative_to(root)), "size": x.stat().st_size,
                       "sha256": sha256_file(x)} for x in items]
    if not eval_only:  # the small files at the top of the root (a `latest` pointer, a layout descriptor) go too
        for m in sorted(root.iterdir()):
            if m.is_file() and not m.is_symlink() and m.stat().st_size < (1 << 20) and m.name not in tops:
                tops.append(m.name)
                files.append({"rel": m.name, "size": m.stat().st_size, "sha256": sha256_file(m)})
    name = as_name or run_dir.name  # the record there (a failover names one of its own: never a run's directory)
    request = {"name": name, "backend": backend, "files": files,
               "source": f"{state.get('host') or 'local'}:{run_dir.name}"}
    have = call_remote(runner, "adopt", {**request, "check": True}, timeout=600)
    if not have.get("missing") and have.get("adopted"):
        return len(files), False
    dest = f"runs/{name}/checkpoints"
    if have.get("missing"):
        runner.run(["mkdir", "-p", dest], timeout=60)
        runner.rsync([f"{root}/./{t}" for t in tops], dest + "/", up=True,
                     extra=["--relative", "--partial", "--partial-dir=.rsync-partial"])
    call_remote(runner, "adopt", request, timeout=600)
    return len(files), True


# ---- evals on a host ----------------------------------------------------------------------------------------------


def eval_paths(ev: dict[str, Any], extra: list[str], base: bool = True) -> list[str]:
    """The paths an eval spec names that a host needs, wherever they are: each set's data, the reward file, a local
    base model (with `base`: for the baseline or LoRA adapters), the command evaluator's scripts, and `extra` (the
    recipe, a local model)."""
    cands = [s.get("data") for s in ev.get("sets") or []] + [ev.get("reward_file"), *extra]
    if base:
        cands.append(ev.get("base_model"))
    if ev.get("command"):
        cands += script_words(ev["command"])
    out: dict[str, None] = {}
    for c in cands:
        if isinstance(c, str) and c and "://" not in c and not c.startswith("random:"):
            out.setdefault(c, None)
    return list(out)


def eval_files(ev: dict[str, Any], extra: list[str], base: bool = True) -> list[Path]:
    """Of eval_paths, the local files (or directories) that exist here."""
    return [Path(c) for c in eval_paths(ev, extra, base) if Path(c).exists()]


def stage_manifest(paths: list[Path]) -> tuple[dict[str, str], dict[str, str], dict[str, Path]]:
    """(manifest {rel: sha256}, staged {local path as written: rel}, blobs {sha256: file}) for these files and
    directories, relative to their common parent: laid out on the host as here, content-addressed."""
    from rlctl.executors.ssh_remote import describe, tree

    sets = {str(p): {"resolved": str(p.resolve()), "files": describe(tree(p.resolve(), staged=True))}
            for p in paths}
    manifest, staged = stage_layout(sets)
    blobs = {f["sha256"]: Path(f["path"]) for s in sets.values() for f in s["files"]}
    return manifest, staged, blobs


def stage_layout(sets: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(manifest {rel: sha256}, staged {path as written: rel}) of file sets {path as written: {resolved, files:
    [{path, sha256}]}} (wherever they are: here, or on a run's host), relative to their common parent."""
    files = {f["path"]: f["sha256"] for s in sets.values() for f in s["files"]}
    if not files:
        return {}, {}
    tops = [s["resolved"] for s in sets.values()]
    base = Path(os.path.commonpath([str(Path(t).parent) for t in tops] + [str(Path(f).parent) for f in files]))
    manifest = {str(Path(f).relative_to(base)): sha for f, sha in files.items()}
    staged = {p: str(Path(s["resolved"]).relative_to(base)) for p, s in sets.items()}
    staged.update({s["resolved"]: str(Path(s["resolved"]).relative_to(base)) for s in sets.values()})
    return manifest, staged


def _eval_secrets() -> dict[str, str]:
    names = {n for n in FORWARD if n in os.environ}
    names |= {n.strip() for n in os.environ.get("RLCTL_FORWARD_ENV", "").split(",") if n.strip() in os.environ}
    return {n: os.environ[n] for n in sorted(names)}


def _pending_on(mark: Path) -> str | None:
    if mark.exists() and not mark.is_file():  # never read a FIFO (it would block) nor write over a directory
        raise RlctlError(f"{mark}: not a file; rlctl keeps a step's pending mark there.",
                         hint=f"remove it: rm -r {mark}")
    try:
        return str(json.loads(mark.read_text())["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _stage_from(src: Runner, dst: Runner, paths: list[str], out: Any, no_route: dict[tuple[str, str], str]
                ) -> tuple[dict[str, str], dict[str, str]]:
    """The files these paths name on `src` (a run's host), as blobs on `dst` (copied host to host when they are not
    there yet): (manifest, staged) of their stage there."""
    sets = call_remote(src, "files", {"paths": paths}, timeout=600).get("files") or {}
    manifest, staged = stage_layout(sets)
    blobs = {f["sha256"]: {**f, "rel": f["sha256"]} for st in sets.values() for f in st["files"]}
    if blobs:
        n, route = relay(src, dst, list(blobs.values()), BLOBS, out, no_route=no_route)
        if n:
            print(f"rlctl: eval sets' files ({n}) copied from {src.host.name} to {dst.host.name} {route} (verified)",
                  file=out)
    return manifest, staged


def relay_checkpoints(src: Runner, dst: Runner, name: str, picks: dict[str, Any], out: Any,
                      no_route: dict[tuple[str, str], str] | None = None) -> tuple[int, str]:
    """These checkpoints of a run on `src` (the "ckpt" verb's answer: root, backend, picks with their files) to
    `dst` as a run record of the same name, host to host (ssh_relay), each file's size and sha256 checked there.
    (number of files, the route: "already there", "directly" or "through this machine")."""
    root = str(picks["root"]).rstrip("/")
    files = {f["rel"]: {**f, "path": f"{root}/{f['rel']}"} for p in picks["picks"] for f in p["files"]}
    sums = [{k: f[k] for k in ("rel", "size", "sha256")} for f in files.values()]
    request = {"name": name, "backend": picks.get("backend") or "", "files": sums,
               "source": f"{src.host.name}:{name}"}
    have = call_remote(dst, "adopt", {**request, "check": True}, timeout=600)
    if not have.get("missing") and have.get("adopted"):
        return len(files), "already there"
    _, route = relay(src, dst, list(files.values()), f"runs/{name}/checkpoints", out, missing=have.get("missing"),
                     no_route=no_route)
    call_remote(dst, "adopt", request, timeout=600)
    return len(files), route


def eval_on(host_name: str, ev: dict[str, Any], steps: list[int], run_dir: Path | None = None,
            model: str | None = None, recipe: str | None = None, set_names: list[str] | None = None,
            gpu: str | None = None, recipe_given: bool = True, out: Any = None, pending_dir: Path | None = None) -> Any:
    """`rlctl eval ... --on HOST`: one eval job per step on the host, under its own rlctl (its GPUs, `gpu` as
    CUDA_VISIBLE_DEVICES there). Yields each step's answer {step, model, metrics, error, result, log_tail, host,
    in_place} once it is complete, so a caller records only finished results.

    - a local run: its complete checkpoints of `steps` are pushed (ckpt push's verified transfer; what is there
      already is not sent), the sets' files and the recipe go content-addressed; the caller records the results;
    - a run that lives on HOST: evaluated there in place, results into its stream there (the mirror refreshed);
      with its own recipe there, unless `recipe_given` (--recipe: its sets' files travel as for a local run);
    - no run: the base model `model` (a local model directory travels too).

    A step in flight is marked in `pending_dir` (step-N.pending) until its answer has been recorded: after a cut
    connection the next call asks the host to pick that job up (still running, or finished unclaimed) instead of
    evaluating the step twice."""
    from rlctl.evals.loop import model_dir
    from rlctl.runs.checkpoints import checkpoint_dir, find_checkpoints

    out = out or sys.stderr
    host = get_host(host_name)
    model_paths: dict[int, str] = {}
    runner = Runner(host, connect_timeout=SSHExecutor.timeout)
    timeout = float(ev.get("timeout_s") or 3600) + 600  # the job's own limit, plus loading the model
    base_req: dict[str, Any] = {"env": _eval_secrets()}
    in_place = False
    source: Runner | None = None  # a run that lives on another host: its checkpoints come from there
    no_route: dict[tuple[str, str], str] = {}  # host pairs whose direct copy failed in this command
    remote_dir = ""
    if run_dir is not None and read_state(run_dir).get("executor") == "ssh":
        where, remote_dir = _handle(read_state(run_dir))
        if where.name == host.name:
            in_place = True
            base_req.update(in_place=True, run_dir=remote_dir, set_names=set_names, gpu=gpu)
        else:
            source = Runner(where, connect_timeout=SSHExecutor.timeout)
    # reachable, and an rlctl there that knows remote evals (an older one answers with its usage line)
    call_remote(runner, "eval", {"probe": True}, timeout=max(30.0, SSHExecutor.timeout))
    picks = []
    far: dict[str, Any] = {}  # a run on another host: what an evaluator loads of each checkpoint, as it is there
    if source is not None:
        far = call_remote(source, "ckpt", {"run_dir": remote_dir, "steps": [s for s in steps if s > 0]}, timeout=600)
    elif run_dir is not None and not in_place:
        picks = [c for c in find_checkpoints(read_state(run_dir).get("backend", ""), run_dir)
                 if c.complete and c.step in steps and c.step > 0]
    # a local base model travels only when it is evaluated (step 0), under LoRA adapters, or for its tokenizer
    base = 0 in steps or any((Path(model_dir(c)) / "adapter_config.json").is_file()
                             or not (Path(model_dir(c)) / "tokenizer_config.json").is_file() for c in picks) \
        or any(p["adapter"] or not p["tokenizer"] for p in far.get("picks") or [])
    if not in_place or recipe_given:
        extra = [x for x in (recipe, model) if x]
        if source is not None and not recipe_given:  # the run's own recipe: the files it names are on its host
            manifest, staged = _stage_from(source, runner, eval_paths(ev, [], base), out, no_route)
        else:
            manifest, staged, blobs = stage_manifest(eval_files(ev, extra, base))
            if blobs:
                print(f"rlctl: sending {len(blobs)} file(s) to {host.name} (eval sets, recipe; only those it lacks)",
                      file=out)
                send_blobs(runner, blobs, timeout=60)
        # the stage is named by its content: the next eval of the same files reuses it (no second copy of a model)
        token = "eval-" + hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:20]
        base_req.update(token=token, manifest=manifest, staged=staged, ev=ev)
        if in_place:
            pass  # its checkpoints are there
        elif source is not None and run_dir is not None:
            if far.get("picks"):
                n, route = relay_checkpoints(source, runner, run_dir.name, far, out, no_route)
                done = "already on" if route == "already there" else f"copied from {source.host.name} to"
                how = f" {route}" if route != "already there" else ""
                print(f"rlctl: checkpoint(s) of step {', '.join(str(p['step']) for p in far['picks'])} {done} "
                      f"{host.name}{how} ({n} files, verified)", file=out)
            model_paths = {p["step"]: f"runs/{run_dir.name}/checkpoints/{p['model']}" for p in far.get("picks") or []}
            base_req["run_dir"] = f"runs/{run_dir.name}"
        elif run_dir is not None:
            if picks:
                n, sent = push_checkpoints(run_dir, picks, runner, eval_only=True)
                print(f"rlctl: checkpoint(s) of step {', '.join(str(c.step) for c in picks)} "
                      f"{'copied to' if sent else 'already on'} {host.name} ({n} files, verified)", file=out)
            root = checkpoint_dir(run_dir).resolve()
            # where each evaluated directory landed there (relative to the workdir)
            model_paths = {c.step: f"runs/{run_dir.name}/checkpoints/{Path(model_dir(c)).resolve().relative_to(root)}"
                           for c in picks}
            base_req["run_dir"] = f"runs/{run_dir.name}"
        else:
            base_req.update(model=model, name=Path(str(model)).name)
    for s in steps:
        mark = pending_dir / f"step-{s}.pending" if pending_dir is not None else None
        adopt = mark is not None and _pending_on(mark) == host.name
        if adopt:
            print(f"rlctl: step {s} was in flight on {host.name} when a connection was lost: picking up that job "
                  "(still running or finished there), not starting another", file=out)
        else:
            print(f"rlctl: evaluating step {s} on {host.name}", file=out)
        if mark is not None:
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.write_text(json.dumps({"host": host.name, "at": time.time()}) + "\n")
        req = {**base_req, "step": s, "adopt": adopt, **({"model_path": model_paths[s]} if s in model_paths else {})}
        try:
            answer = call_remote(runner, "eval", req, timeout=timeout)
        except RlctlError as e:
            if "No space left on device" in e.message or "Disk quota exceeded" in e.message:
                e.hint = e.hint or (f"free space in {host.workdir} on {host.name} (rlctl hosts check {host.name} "
                                    "shows it), then run the eval again")
            raise
        if source is not None:  # the run's stream is on its host: the result goes there (the mirror follows)
            call_remote(source, "record", {"run_dir": remote_dir, "step": s, "metrics": answer.get("metrics") or {},
                                           "error": answer.get("error"), "sets": [x["name"] for x in ev["sets"]],
                                           "host": host.name,
                                           "job": f"{host.name}:{answer['job']}" if answer.get("job") else None},
                        timeout=120)
        yield {**answer, "host": host.name, "in_place": in_place, "recorded": in_place or source is not None}
        if mark is not None:  # the caller has recorded it
            mark.unlink(missing_ok=True)
    if (in_place or source is not None) and run_dir is not None:  # results in the host's stream: refresh the mirror
        with contextlib.suppress(RlctlError):
            SSHExecutor().status(run_dir, read_state(run_dir))
