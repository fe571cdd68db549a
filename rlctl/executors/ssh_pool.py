"""Pools of SSH hosts: the SSH executor's side of failover (rlctl.runs.failover asks, through the executor registry).

- pick_host: the first host of a pool whose facts (as `rlctl hosts check` reads them: GPUs, their memory, free disk;
  all hosts asked in parallel) fit the plan (rlctl.runs.pool.misfit); why each other one was passed over;
- launch_pool: `launch --on box1,box2` / `[run] on = [...]`: generation 1 claimed in the run's sync store, the run
  started on the host picked, and the record keeps what starting it elsewhere needs (the request with the inputs'
  hashes, copies of the inputs, the names of the secrets it was sent);
- probe: one round trip to an attempt's host: alive, ended, unreachable, or gone (it answers without the run's
  processes, or without its run directory, or its processes live while the GPUs they were placed on at launch are
  gone: rlctl.executors.host_gpus; then "running" says they still run there, for failover to stop them);
- relaunch: the next attempt on another host, with the same inputs, from the checkpoint failover chose (the store's:
  the host fetches it; one here: pushed, verified);
- stop_attempt: `rlctl stop` of an old attempt on a host that answers again.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from rlctl.core.host import get_host
from rlctl.core.state import ACTIVE, read_state, write_state
from rlctl.errors import CheckFailed, RlctlError
from rlctl.executors.ssh import SSHExecutor
from rlctl.executors.ssh_inputs import inputs_of


def pick_host(hosts: list[str], needs: dict[str, Any], exclude: Any = (), out: Any = None
              ) -> tuple[str | None, list[str]]:
    """(the first host of `hosts`, not in `exclude`, that fits `needs`, or None; why each one before it did not)."""
    from concurrent.futures import ThreadPoolExecutor

    from rlctl.executors.ssh import host_facts
    from rlctl.runs.pool import misfit

    del out  # Unused
    cands = [h for h in hosts if h not in set(exclude)]

    def one(name: str) -> tuple[str, dict[str, Any] | None, str | None]:
        try:
            return name, host_facts(get_host(name), timeout=20), None
        except RlctlError as e:
            return name, None, e.message.removeprefix(f"{name}: ")

    with ThreadPoolExecutor(max_workers=max(1, len(cands))) as pool:
        rows = list(pool.map(one, cands))
    notes = []
    for name, facts, err in rows:  # in the pool's order
        if facts is None:
            notes.append(f"{name}: cannot take it: {err}")
            continue
        why = misfit(facts, needs)
        if why:
            notes.append(f"{name}: does not fit the plan: {why}")
            continue
        return name, notes
    return None, notes


def launch_pool(opts: Any, hosts: list[str], out: Any = None) -> tuple[Path, int]:
    """`rlctl launch RECIPE --on box1,box2` (or `[run] on = [...]`): the first host that fits, generation 1 claimed
    in the run's sync store (fencing), the run started there with the pool recorded for `rlctl watch`."""
    from rlctl.executors.ssh import launch_remote
    from rlctl.recipe.planning import prepare
    from rlctl.runs import fencing
    from rlctl.runs.pool import plan_needs

    out = out or sys.stderr
    for h in hosts:
        get_host(h)  # an unknown name is bad input, before anything is asked
    prep = prepare(opts.recipe, opts.sets)
    r = prep.recipe
    needs = plan_needs(prep)
    host, notes = pick_host(hosts, needs)
    for n in notes:
        print(f"rlctl: {n}", file=out)
    if host is None:
        raise CheckFailed(f"no host of the pool ({', '.join(hosts)}) can take this run.",
                          hint="rlctl hosts check NAME shows each one's GPUs and free disk; free space or add a host")
    sync = r.checkpoint.sync
    if not sync:
        from rlctl.preflight.placement import pool as pool_check

        res = pool_check(_Ctx(r))
        if res is not None and res.verdict == "warn":
            print(f"rlctl: warning: {res.figure}\n  fix: {res.fix}", file=out)
    token = fencing.new_token()
    lineage: dict[str, Any] = {"generation": 1, "token": token}
    if sync:
        from rlctl.runs.sync import store

        fs, root = store(sync)
        held = fencing.current(fs, root)
        if held is not None and not opts.force:
            raise RlctlError(f"checkpoint.sync = {sync} holds the generations of a pool run already "
                             f"(#{held.get('generation')} on {held.get('host')}); two runs must not share a store "
                             "(one would fence the other).",
                             hint=f"give this run a prefix of its own (e.g. {sync.rstrip('/')}/{r.name}-2), or "
                                  "--force to take the store over")
        rec = fencing.claim(sync, {"host": host, "token": token, "from_step": None, "from_manifest": None,
                                   "run_dir": None})
        lineage = {"generation": rec["generation"], "token": token,
                   "fence": fencing.fence_spec(sync, rec, host, r.run.failover_after_s)}
    print(f"rlctl: pool {', '.join(hosts)}: on {host}", file=out)
    pool = {"executor": "ssh", "hosts": list(hosts), "failover_after_s": r.run.failover_after_s,
            "on_event": r.run.on_event, "sync": sync, "needs": needs}
    try:
        local, code = launch_remote(opts, host, out, prep=prep, pool=pool, lineage=lineage)
    except BaseException:
        if sync:  # nothing started: the claim goes, so the next launch finds the store as it was
            with contextlib.suppress(Exception):
                fencing.withdraw(sync, lineage["generation"], token)
        raise
    if sync:
        with contextlib.suppress(Exception):
            fencing.amend(sync, lineage["generation"], token, run_dir=read_state(local).get("remote_run_dir"))
    return local, code


class _Ctx:
    """The one field of a preflight Context the pool check reads."""

    def __init__(self, recipe: Any):
        self.recipe = recipe


def relaunch(run_dir: Path, place: str, lineage: dict[str, Any], source: dict[str, Any], out: Any = None
             ) -> dict[str, Any]:
    """The run's next attempt on `place`: the same inputs and options as its launch, a run directory named
    `<run>-g<generation>`, resumed from `source` ({"kind": "store", url, manifest} | {"kind": "local", step} |
    {"kind": None}); the lineage (fence, W&B run id, the stream so far) travels with it. The local record follows
    the new attempt; returns its ref {host, run_dir}."""
    import uuid

    from rlctl.executors.ssh import push_checkpoints, send_blobs
    from rlctl.executors.ssh_runner import Runner, call_remote

    out = out or sys.stderr
    st = read_state(run_dir)
    pool = st.get("pool") or {}
    req = pool.get("request") or {}
    host = get_host(place)
    runner = Runner(host)
    missing = [n for n in pool.get("env_names") or [] if n not in os.environ]
    if missing:
        raise RlctlError(f"{run_dir.name} was sent {', '.join(missing)} at its launch and this environment does not "
                         "have it: its next attempt would start without it.",
                         hint=f"export {missing[0]}=... where rlctl watch runs")
    env = {n: os.environ[n] for n in pool.get("env_names") or []}
    options = {**(req.get("options") or {})}
    options["sets"] = [*options.get("sets", []), *_secret_sets(run_dir, options.pop("secret_sets", []))]
    shas = inputs_of(run_dir.resolve(), pool)
    send_blobs(runner, shas, timeout=60)
    name = f"{run_dir.name}-g{int(lineage['generation'])}"
    options.update(name=name, exact_name=True, lineage=lineage)
    if source.get("kind") == "store":
        options.update(resume=source["url"], resume_manifest=source["manifest"])
    elif source.get("kind") == "local":
        from rlctl.runs.checkpoints import find_checkpoints

        ckpt = next(c for c in find_checkpoints(st.get("backend", ""), run_dir)
                    if c.complete and c.step == source["step"])
        n, _ = push_checkpoints(run_dir, [ckpt], runner, as_name=f"{name}-from")
        print(f"rlctl: step {ckpt.step} of {run_dir.name} copied from this machine to {place} ({n} files, verified)",
              file=out)
        options["resume"] = f"{name}-from"
    request = {k: req[k] for k in ("manifest", "recipe", "paths", "git") if k in req}
    request.update(token=f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}", env=env, options=options)
    answer = call_remote(runner, "launch", request, timeout=600)
    ref = {"host": place, "run_dir": answer["run_dir"]}
    make_current(run_dir, ref, answer.get("state") or {})
    return ref


def _secret_sets(run_dir: Path, keys: list[str]) -> list[str]:
    """The run's `--set KEY=SECRET` again, each value from the environment (the record kept only the key): the
    variable named like the key's last part (env.HF_TOKEN -> HF_TOKEN, hub_token -> HUB_TOKEN or hub_token)."""
    import json

    out = []
    for key in keys:
        leaf = key.rsplit(".", 1)[-1]
        name = next((n for n in (leaf, leaf.upper()) if n in os.environ), None)
        if name is None:
            raise RlctlError(f"{run_dir.name} was launched with --set {key}=... (a secret: its value was not kept) "
                             f"and {leaf.upper()} is not in this environment.",
                             hint=f"export {leaf.upper()}=... where rlctl watch runs")
        out.append(f"{key}={json.dumps(os.environ[name])}")
    return out


def attempt_ref(run_dir: Path, place: str, generation: int) -> dict[str, Any]:
    """Where relaunch puts attempt #generation on `place` (relative to the host's workdir)."""
    return {"host": place, "run_dir": f"runs/{run_dir.name}-g{int(generation)}"}


def make_current(run_dir: Path, ref: dict[str, Any], there: dict[str, Any]) -> None:
    """The local record follows this attempt from now on: its handle, host and state as told there."""
    from rlctl.executors.ssh import STATE_KEYS

    write_state(run_dir, executor="ssh", host=ref["host"], remote_run_dir=ref["run_dir"],
                handle={"executor": "ssh", "ref": dict(ref), "attempt": 1}, last_contact=time.time(),
                unreachable=None, **{k: there[k] for k in STATE_KEYS if k in there
                                     and k not in ("wandb_run_id", "started_at")})  # the run began with attempt #1


def probe(run_dir: Path, ref: dict[str, Any], current: bool = False) -> dict[str, Any]:
    """One round trip to the attempt `ref` ({host, run_dir}): {"state": alive | ended | unreachable | gone, "why",
    "status", "step", "outcome", "superseded_by", "running" (gone, yet its processes still run there: its GPUs
    are gone)}. For the run's current attempt (`current`), its state and the mirror here are refreshed as `rlctl
    status` does."""
    from rlctl.executors.ssh import mirror, record
    from rlctl.executors.ssh_runner import Runner, call_remote

    try:
        host = get_host(str(ref["host"]))
    except RlctlError as e:
        return {"state": "unreachable", "why": e.message}
    rd = str(ref["run_dir"])
    runner = Runner(host, connect_timeout=min(SSHExecutor.timeout, 10))
    try:
        answer = call_remote(runner, "poll", {"run_dirs": [rd], "gpus": True}, timeout=max(SSHExecutor.timeout, 30))
    except RlctlError as e:
        if current:
            write_state(run_dir, unreachable=e.message)
        return {"state": "unreachable", "why": e.message}
    entry = answer.get(rd) or {"error": "no answer for this run"}
    if "error" in entry:
        if "no run directory" in str(entry["error"]):
            return {"state": "gone", "why": f"{host.name} answers, but {rd} is not there (a new machine behind "
                                            "the name?)"}
        return {"state": "unreachable", "why": f"{host.name}: {entry['error']}"}
    summ = entry.get("summary") or {}
    there = entry.get("state") or {}
    if current:
        if (read_state(run_dir).get("handle") or {}).get("ref") != ref:
            make_current(run_dir, ref, there)
        record(run_dir, entry)
        with contextlib.suppress(RlctlError):
            mirror(run_dir, runner, rd, timeout=max(SSHExecutor.timeout, 30))
    status = str(summ.get("status") or there.get("status") or "unknown")
    found = {"status": status, "step": summ.get("step"), "outcome": there.get("outcome"),
             "superseded_by": there.get("superseded_by")}
    if status == "lost":
        return {**found, "state": "gone", "why": f"{host.name} answers, but the run's processes are gone there"}
    if status in ACTIVE or status == "stalled":
        if entry.get("gpus_gone"):  # its processes live on GPUs that are gone: it cannot progress
            from rlctl.executors.host_gpus import why

            return {**found, "state": "gone", "running": True, "why": why(entry["gpus_gone"])}
        return {**found, "state": "alive"}
    return {**found, "state": "ended"}


def stop_attempt(ref: dict[str, Any], grace: float = 10.0) -> str:
    """`rlctl stop` of an old attempt there (SIGTERM to its process group, SIGKILL after `grace`)."""
    from rlctl.executors.ssh_runner import Runner, remote_rlctl_error

    host = get_host(str(ref["host"]))
    runner = Runner(host)
    p = runner.rlctl(["stop", str(ref["run_dir"]), "--grace", f"{grace:g}"], timeout=grace + 60, check=False)
    if p.returncode != 0:
        raise remote_rlctl_error(host, p) or RlctlError(f"{host.name}: stop failed: "
                                                       f"{(p.stderr or p.stdout).strip()[-300:]}")
    return p.stdout.strip()


class SSHPoolExecutor(SSHExecutor):
    """The SSH executor (registered as "ssh") with its pools: what rlctl.runs.failover asks of it."""

    pools: ClassVar[bool] = True

    def launch(self, opts: Any, host_name: str | list[str], out: Any = None) -> tuple[Path, int]:
        if isinstance(host_name, list):  # a pool: the first host that fits
            return launch_pool(opts, host_name, out)
        return super().launch(opts, host_name, out)

    def pick_place(self, places: list[str], needs: dict[str, Any], exclude: Any = (), out: Any = None
                   ) -> tuple[str | None, list[str]]:
        return pick_host(places, needs, exclude, out)

    def probe(self, run_dir: Path, ref: dict[str, Any], current: bool = False) -> dict[str, Any]:
        return probe(run_dir, ref, current)

    def relaunch(self, run_dir: Path, place: str, lineage: dict[str, Any], source: dict[str, Any],
                 out: Any = None) -> dict[str, Any]:
        return relaunch(run_dir, place, lineage, source, out)

    def attempt_ref(self, run_dir: Path, place: str, generation: int) -> dict[str, Any]:
        return attempt_ref(run_dir, place, generation)

    def stop_attempt(self, ref: dict[str, Any], grace: float = 10.0) -> str:
        return stop_attempt(ref, grace)
