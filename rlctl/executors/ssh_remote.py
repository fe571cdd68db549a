"""The remote half of the SSH executor: what the host's own rlctl does when the laptop asks
(`python -m rlctl.executors.ssh_remote VERB`, VERB one of blobs, launch, poll, ckpt, adopt, eval, files, verify,
send, record, stage; no CLI framework is imported, so a poll answers fast). Each reads one JSON request on stdin
(secrets included: never on a command line) and prints one JSON answer on stdout, so every question costs one round
trip. Errors: exit 2 (bad input) or 1, the
message on stderr as `rlctl: ...`.

Blobs: files the laptop sent, named by their sha256, under `<workdir>/.rlctl/blobs/`; a launch materialises its
recipe and everything it references from them in `<workdir>/.rlctl/stage/<token>/`, checking every hash first.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from rlctl.errors import CheckFailed, RlctlError

BLOBS = ".rlctl/blobs"
STAGE = ".rlctl/stage"
REPOS = ".rlctl/repos"


def read_request() -> dict[str, Any]:
    try:
        req = json.loads(sys.stdin.read() or "{}")
    except ValueError as e:
        raise RlctlError(f"remote request is not JSON ({e}).", hint="do the local and remote rlctl versions differ?"
                         ) from None
    if not isinstance(req, dict):
        raise RlctlError("remote request must be a JSON object.")
    return req


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree(top: Path, staged: bool = False) -> list[Path]:
    """The files of `top` (itself when a file), sorted. A checkpoint's are its own (symlinks inside it are left
    out); files `staged` for a job follow symlinks and leave a repository's .git out."""
    if top.is_file():
        return [top]

    def keep(x: Path) -> bool:
        return ".git" not in x.parts if staged else not x.is_symlink()

    return sorted(x for x in top.rglob("*") if x.is_file() and keep(x))


def describe(files: list[Path], root: Path | None = None) -> list[dict[str, Any]]:
    """Each file's size and sha256, named by its absolute path (and, under `root`, by its path relative to it)."""
    out = []
    for f in files:
        d: dict[str, Any] = {"path": str(f.resolve()), "size": f.stat().st_size, "sha256": sha256_file(f)}
        if root is not None:
            d["rel"] = str(f.resolve().relative_to(root))
        out.append(d)
    return out


def file_sets(paths: list[str]) -> dict[str, Any]:
    """For each of these paths that exists here: its resolved path and its files (as stage_manifest lays them out on
    the laptop); the others are left out. What another host needs of an eval spec that names files here."""
    out: dict[str, Any] = {}
    for p in paths:
        q = Path(p).expanduser()
        if q.exists():
            out[p] = {"resolved": str(q.resolve()), "files": describe(tree(q.resolve(), staged=True))}
    return out


def verify_files(dest: str, files: list[dict[str, Any]]) -> list[str]:
    """The files (rel, size, sha256) under `dest` that are missing here or differ: what a transfer still has to
    bring, or, after it, what did not arrive intact."""
    root = Path(dest).expanduser()
    bad = []
    for f in files:
        p = root / f["rel"]
        if not p.is_file() or p.stat().st_size != f["size"] or sha256_file(p) != f["sha256"]:
            bad.append(f["rel"])
    return bad


def send(req: dict[str, Any]) -> dict[str, Any]:
    """Copy files from this host straight to another one (rsync over this host's own ssh: its ~/.ssh/config, keys
    and known_hosts; never a password prompt). {files: [{path, rel}], ssh, options, dest (absolute there)}. A
    failure is an answer, not an error: the laptop then copies through itself; a full disk there is said as such."""
    import shlex
    import subprocess
    import tempfile

    files = list(req.get("files") or [])
    with tempfile.TemporaryDirectory(prefix="rlctl-send-") as tmp:
        for f in files:  # laid out as at the destination; rsync -L copies what each link names
            rel = str(f["rel"])
            if rel.startswith("/") or ".." in Path(rel).parts:
                raise RlctlError(f"refusing a destination path outside the destination: {rel!r}")
            link = Path(tmp) / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(Path(f["path"]))
        ssh = shlex.join(["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(req.get('connect_timeout', 10))}",
                          "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3",
                          *[str(o) for o in req.get("options") or []]])
        argv = ["rsync", "-a", "-L", "--partial", "--partial-dir=.rsync-partial", "-e", ssh, f"{tmp}/",
                f"{req['ssh']}:{req['dest'].rstrip('/')}/"]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=float(req.get("timeout", 3600)))
        except FileNotFoundError:
            return {"sent": False, "why": "rsync is not installed here"}
        except subprocess.TimeoutExpired:
            return {"sent": False, "why": f"rsync did not finish within {req.get('timeout', 3600)} s"}
    if p.returncode == 0:
        return {"sent": True}
    err = [ln.strip() for ln in p.stderr.strip().splitlines() if ln.strip()]
    own = [ln for ln in err if not ln.startswith("rsync")]  # ssh's own words (no such host, refused key) first
    why = " | ".join((own or err)[-2:]) or f"rsync exit {p.returncode}"
    full = "No space left on device" in p.stderr or "Disk quota exceeded" in p.stderr
    return {"sent": False, "why": why, "disk_full": full}


def missing_blobs(shas: list[str]) -> list[str]:
    """Which of these blobs this machine lacks (a damaged blob counts as missing and is removed)."""
    root = Path(BLOBS)
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for s in shas:
        p = root / s
        if not p.is_file():
            out.append(s)
        elif sha256_file(p) != s:
            p.unlink()
            out.append(s)
    return out


def materialise(manifest: dict[str, str], token: str) -> Path:
    """Copy each blob to its place under a fresh stage directory, after checking its hash."""
    if not token.replace("-", "").replace(".", "").replace("_", "").isalnum():
        raise RlctlError(f"bad stage name {token!r}")
    stage = Path(STAGE) / token
    stage.mkdir(parents=True, exist_ok=False)
    for rel, sha in manifest.items():
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise RlctlError(f"refusing a staged path outside the stage directory: {rel!r}")
        blob = Path(BLOBS) / sha
        if not blob.is_file():
            raise RlctlError(f"{rel}: its content (sha256 {sha[:12]}) did not arrive on this host.",
                             hint="run the launch again: only missing files are sent")
        got = sha256_file(blob)
        if got != sha:
            blob.unlink()
            raise RlctlError(f"{rel}: arrived damaged (sha256 {got[:12]} != {sha[:12]}); nothing started.",
                             hint="run the launch again")
        dst = stage / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(blob, dst)
    return stage.resolve()


def checkout_bundle(git: dict[str, Any], host: str | None = None) -> Path:
    """Clone the shipped git bundle and check out the laptop's commit: the SHA (or, for a bundle of HEAD's files
    alone, the tree) checked out must equal the local one. A disk that cannot hold it is said as a full disk."""
    import subprocess

    sha = git["sha"]
    repo = Path(REPOS) / sha
    if not (repo / ".git").is_dir():
        bundle = Path(BLOBS) / git["bundle_sha256"]
        repo.parent.mkdir(parents=True, exist_ok=True)
        p = subprocess.run(["git", "clone", "-q", "--no-checkout", str(bundle.resolve()), str(repo)],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            _git_failed(repo, p, "cloning the shipped git bundle", host)
    want = git.get("commit") or sha
    p = subprocess.run(["git", "-C", str(repo), "checkout", "-q", want], capture_output=True, text=True, timeout=120,
                       check=False)
    if p.returncode != 0:
        _git_failed(None, p, "checking out the shipped commit", host)
    field, expected = ("HEAD^{tree}", git["tree"]) if git.get("tree") else ("HEAD", sha)
    got = subprocess.run(["git", "-C", str(repo), "rev-parse", field], capture_output=True, text=True,
                         timeout=60).stdout.strip()
    if got != expected:
        raise RlctlError(f"the remote checkout is at {got[:12] or '?'}, not the local commit {sha[:12]}; nothing "
                         "started.")
    return repo.resolve()


def _git_failed(partial: Path | None, p: Any, doing: str, host: str | None) -> None:
    """git failed here: on a full disk, that (as rlctl says it of a run: rlctl.runs.disk_full), its half-written
    clone removed so the space comes back; else git's own last lines."""
    from rlctl.runs.disk_full import SIGNS, full_while, low_disk_at

    lines = [ln.strip() for ln in (p.stderr or "").splitlines() if ln.strip()]
    low = low_disk_at(Path(REPOS))  # measured before the half-written clone goes
    if partial is not None:
        shutil.rmtree(partial, ignore_errors=True)
    signs = (*SIGNS, "unable to write", "write error")
    said = [ln for ln in lines if any(s in ln for s in signs)]
    if low or said:
        raise CheckFailed(f"{full_while(doing, host)}" + (f" ({low})" if low else "")
                          + (f": git: {(said or lines)[-1]}" if lines else ""),
                          hint=f"free space in the host's workdir (rlctl hosts check {host or 'HOST'} shows it), "
                               "then launch again: files already there are not sent twice")
    raise RlctlError(f"git failed {doing}: {' | '.join(lines[-3:]) or f'exit {p.returncode}'}")


def remote_launch(req: dict[str, Any]) -> dict[str, Any]:
    """Materialise the recipe, export the secrets, run `rlctl launch --detach` here; the answer names the run."""
    from rlctl.runs.launch import LaunchOptions, launch

    token = str(req["token"])
    stage = materialise(dict(req.get("manifest") or {}), token)
    answer: dict[str, Any] = {"stage": str(stage)}
    if req.get("git"):
        answer["git_sha"] = req["git"]["sha"]
        answer["repo"] = str(checkout_bundle(req["git"], req.get("host")))
    for k, v in (req.get("env") or {}).items():  # secrets: in this process's environment only
        os.environ[str(k)] = str(v)
    os.environ["RLCTL_REMOTE_SIDE"] = "1"  # `[run] on` names this host: launch here
    o = dict(req.get("options") or {})
    sets = list(o.get("sets") or [])
    sets += [f"{k}={stage / rel}" for k, rel in (req.get("paths") or {}).items()]  # the staged copies, not the laptop's
    import shlex

    for k, words in (req.get("commands") or {}).items():  # a command's scripts: their staged copies too
        line = shlex.join(str(stage / w["staged"]) if isinstance(w, dict) else str(w) for w in words)
        sets.append(f"{k}={json.dumps(line)}")
    opts = LaunchOptions(recipe=str(stage / req["recipe"]), sets=sets, detach=True,
                         smoke=bool(o.get("smoke")), name=o.get("name"), force=bool(o.get("force")),
                         resume=o.get("resume"), grace_seconds=float(o.get("grace", 30.0)),
                         restart=o.get("restart"), max_restarts=o.get("max_restarts"),
                         executor=o.get("executor"), placement=o.get("placement"),  # e.g. slurm on a login node
                         lineage=o.get("lineage"), exact_name=bool(o.get("exact_name")),
                         resume_manifest=o.get("resume_manifest"))
    run_dir, _ = launch(opts, out=sys.stderr)
    from rlctl.runs.state import read_state

    st = read_state(run_dir)
    if st.get("executor") == "local":  # its processes run on this host: the GPUs they were placed on, for poll
        record_gpus(run_dir)
    answer.update(run_dir=str(run_dir), name=run_dir.name, state=st)
    return answer


def record_gpus(run_dir: Path) -> None:
    """The GPUs a run just launched here takes (its recipe's gpus_per_node and CUDA_VISIBLE_DEVICES, else this
    host's), as nvidia-smi lists them now: what a poll with `gpus` compares against (rlctl.executors.host_gpus)."""
    import tomllib

    from rlctl.executors import host_gpus

    try:
        data = tomllib.loads((run_dir / "recipe.toml").read_text())
        per_node = int((data.get("resources") or {}).get("gpus_per_node") or 0)
        visible = (data.get("env") or {}).get("CUDA_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES")
        host_gpus.record(run_dir, per_node, visible)
    except Exception as e:  # never fails a launch: the run is then simply not judged by its GPUs
        print(f"rlctl: the run's GPUs were not recorded ({type(e).__name__}: {e}): a GPU lost later is not seen "
              "as its host gone", file=sys.stderr)


def poll(run_dirs: list[str], stall_after: float = 1800.0, gpus: bool = False) -> dict[str, Any]:
    """Each run's settled state and its summary row (as `rlctl status --json` gives it); with `gpus`, a live run
    whose GPUs recorded at launch are gone now says which ("gpus_gone", rlctl.executors.host_gpus)."""
    from rlctl.runs.state import ACTIVE, read_state, run_status
    from rlctl.runs.status import summary

    out: dict[str, Any] = {}
    for d in run_dirs:
        p = Path(d)
        if not (p / "state.json").is_file():
            out[d] = {"error": f"no run directory {d} on this host"}
            continue
        try:
            rs = run_status(p, stall_after)
            out[d] = {"summary": summary(rs), "state": read_state(p)}
            if gpus and (out[d]["summary"].get("status") in ACTIVE or out[d]["summary"].get("status") == "stalled"):
                from rlctl.executors.host_gpus import check

                lost = check(p)
                if lost:
                    out[d]["gpus_gone"] = lost
        except Exception as e:
            out[d] = {"error": f"{type(e).__name__}: {e}"}
    return out


def checkpoints(run_dir: str, step: int | None, list_only: bool = False) -> dict[str, Any]:
    """The run's checkpoints; for `step` (or the newest complete one), every file with its size and sha256,
    relative to the checkpoint root."""
    from rlctl.runs.checkpoints import checkpoint_dir, find_checkpoints
    from rlctl.runs.state import read_state

    p = Path(run_dir)
    backend = read_state(p).get("backend", "")
    root = checkpoint_dir(p).resolve()
    ckpts = find_checkpoints(backend, p)
    rows = [{"step": c.step, "complete": c.complete, "bytes": c.size(), "path": str(c.path)} for c in ckpts]
    answer: dict[str, Any] = {"root": str(root), "backend": backend, "checkpoints": rows}
    done = [c for c in ckpts if c.complete]
    if list_only:  # what `ckpt list` shows: the final model (no step) and the best, as judged here, beside them
        from rlctl.core.checkpoint import Checkpoint
        from rlctl.runs.checkpoints import best_checkpoint, final_saves

        answer["finals"] = [{"step": None, "name": q.name, "complete": True, "bytes": Checkpoint(0, q, True).size(),
                             "path": str(q)} for q in final_saves(backend, p)]
        answer["best"] = best_checkpoint(p, backend)
        return answer
    pick = None
    if step is None and done:
        pick = done[-1]
    elif step is not None:
        pick = next((c for c in ckpts if c.step == step), None)
        if pick is not None and not pick.complete:
            raise RlctlError(f"step {step} of {p.name} is not a complete checkpoint; only complete ones are moved.",
                             hint="rlctl ckpt list " + p.name)
    if pick is not None:
        from rlctl.runs.checkpoints import root_markers

        files = []
        tops_paths = [*pick.paths(), *root_markers(root)]  # with what a resume from the copy reads besides it
        for top in tops_paths:
            top = top.resolve()
            items = [top] if top.is_file() else sorted(x for x in top.rglob("*") if x.is_file() and not x.is_symlink())
            for f in items:
                try:
                    rel = f.relative_to(root)
                except ValueError:
                    continue
                files.append({"rel": str(rel), "size": f.stat().st_size, "sha256": sha256_file(f)})
        tops = []
        for t in tops_paths:
            try:
                tops.append(str(t.resolve().relative_to(root)))
            except ValueError:
                continue
        # the small files at the top of the checkpoint root travel too (a `latest` pointer, the command backend's
        # descriptor of its layout): without them a copy elsewhere is not recognised, nor resumed from
        for m in sorted(root.iterdir()) if root.is_dir() else []:
            if m.is_file() and not m.is_symlink() and m.stat().st_size < (1 << 20):
                tops.append(m.name)
                files.append({"rel": m.name, "size": m.stat().st_size, "sha256": sha256_file(m)})
        answer["pick"] = {"step": pick.step, "tops": tops, "files": files}
    return answer


def eval_picks(run_dir: str, steps: list[int]) -> dict[str, Any]:
    """For each of these complete checkpoints, what an evaluator loads of it (the HF model or adapter directory, e.g.
    OpenRLHF's global_stepN_hf without its DeepSpeed state) and its files with sizes and sha256, relative to the
    checkpoint root: what another host needs to evaluate them."""
    from rlctl.evals.loop import model_dir
    from rlctl.runs.checkpoints import checkpoint_dir, find_checkpoints
    from rlctl.runs.state import read_state

    p = Path(run_dir)
    backend = read_state(p).get("backend", "")
    root = checkpoint_dir(p).resolve()
    done = {c.step: c for c in find_checkpoints(backend, p) if c.complete}
    picks = []
    for step in steps:
        if step not in done:
            raise RlctlError(f"{p.name} has no complete checkpoint at step {step} on this host.",
                             hint=f"rlctl ckpt list {p.name}")
        m = Path(model_dir(done[step])).resolve()
        try:
            rel = str(m.relative_to(root))
        except ValueError:
            raise RlctlError(f"{m}: outside the run's checkpoint directory {root}; it is not moved.") from None
        picks.append({"step": step, "model": rel, "files": describe(tree(m), root),
                      "adapter": (m / "adapter_config.json").is_file(),
                      "tokenizer": (m / "tokenizer_config.json").is_file()})
    return {"root": str(root), "backend": backend, "picks": picks}


def record_result(req: dict[str, Any]) -> dict[str, Any]:
    """An eval result computed on another host, in a run that lives here: into its stream at the checkpoint's step
    and its ledger, as `rlctl eval` records one here; a job already recorded (a retry after a cut connection) is
    recorded once."""
    from rlctl.evals.ledger import read_ledger
    from rlctl.evals.loop import record_by_hand

    run_dir = Path(str(req["run_dir"])).resolve()
    if not (run_dir / "state.json").is_file():
        raise RlctlError(f"no run directory {req['run_dir']} on this host.")
    job = req.get("job")
    if job and any(isinstance(e, dict) and e.get("job") == job for e in read_ledger(run_dir).get("by_hand") or []):
        return {"run_dir": str(run_dir), "recorded": False}
    metrics = {str(k): float(v) for k, v in (req.get("metrics") or {}).items()}
    record_by_hand(run_dir, int(req["step"]), metrics, req.get("error"), [str(x) for x in req.get("sets") or []],
                   host=req.get("host"), job=job)
    return {"run_dir": str(run_dir), "recorded": True}


def adopt_checkpoint(req: dict[str, Any]) -> dict[str, Any]:
    """`ckpt push`: make a run record here for checkpoints that just arrived (so `launch --resume RUN` finds them),
    after checking every file's size and sha256."""
    import time

    from rlctl.runs.state import read_state, runs_root, write_state

    run_dir = (runs_root() / req["name"]).resolve()
    if (run_dir / "state.json").is_file():  # a run of that name here: only an earlier push of the same source may go on
        prev = read_state(run_dir).get("pushed_from")
        if prev != req.get("source"):
            what = f"checkpoints pushed from {prev}" if prev else "a run of its own"
            raise RlctlError(f"{run_dir} already holds {what}: pushing {req.get('source')} there would mix their "
                             "checkpoints.", hint=f"move or remove {run_dir} on that host, then push again")
    bad = verify_files(str(run_dir / "checkpoints"), req["files"])
    if req.get("check"):  # only which files are missing or differ: the push sends nothing when none
        return {"run_dir": str(run_dir), "missing": bad, "adopted": (run_dir / "state.json").is_file()}
    if bad:
        raise RlctlError(f"{len(bad)} file(s) of the pushed checkpoint differ from the source: {', '.join(bad[:3])}.",
                         hint="run the push again: it resumes")
    (run_dir / "recipe.toml").write_text('[checkpoint]\ndir = "checkpoints"\n')
    write_state(run_dir, name=run_dir.name, status="finished", backend=req["backend"], executor="local",
                started_at=time.time(), ended_at=time.time(), exit_code=0, pushed_from=req.get("source"))
    return {"run_dir": str(run_dir)}


def restage(ev: dict[str, Any], staged: dict[str, str]) -> dict[str, Any]:
    """The laptop's eval spec with each of its local paths (set data, reward file, a local model, the command's
    script) replaced by the staged copy here."""
    import shlex

    def one(v: Any) -> Any:
        return staged.get(v, v) if isinstance(v, str) else v

    out = dict(ev)
    out["sets"] = [{**s, "data": one(s.get("data"))} for s in ev.get("sets") or []]
    for k in ("reward_file", "base_model"):
        out[k] = one(ev.get(k))
    if ev.get("command"):
        out["command"] = shlex.join(one(w) for w in shlex.split(ev["command"]))
    return out


def remote_eval(req: dict[str, Any]) -> dict[str, Any]:
    """`rlctl eval --on HOST`, one checkpoint (or the base model) per request: the job runs here in its own process
    (python -m rlctl.evals.job, this host's GPUs) and the answer carries its results and log tail. In place (a run
    that lives here) the results also go into that run's stream and ledger, as a local `rlctl eval` does."""
    from rlctl.evals.ledger import EVALS, read_ledger
    from rlctl.evals.loop import (
        adopt_job,
        hand_spec,
        job_files,
        job_id,
        log_tail,
        model_dir,
        record_by_hand,
        run_job_here,
    )

    if req.get("probe"):  # the laptop checks that this rlctl knows remote evals before sending anything
        return {"eval": True}
    staged: dict[str, str] = {}
    if req.get("manifest"):
        # one stage per set of files (named by their hashes), made by the first request that needs it
        stage = stage_once(req["manifest"], str(req["token"]))
        staged = {local: str(stage / rel) for local, rel in (req.get("staged") or {}).items()}
    for k, v in (req.get("env") or {}).items():  # secrets: this process's environment (and its job's) only
        os.environ[str(k)] = str(v)
    step = int(req["step"])
    run_dir = Path(req["run_dir"]).resolve() if req.get("run_dir") else None
    if req.get("in_place") and (run_dir is None or not (run_dir / "state.json").is_file()):
        raise RlctlError(f"no run directory {req.get('run_dir')} on this host.")
    if req.get("ev"):  # the laptop's spec (its recipe's sets), its files staged here
        ev = restage(dict(req["ev"]), staged)
    else:  # a run here, with its own recipe
        ev = hand_spec(Path(str(run_dir)) / "recipe.toml", req.get("set_names"), req.get("gpu"))
    if run_dir is not None:
        if req.get("model_path"):  # a checkpoint the laptop pushed: the directory the evaluator loads
            model = str(Path(req["model_path"]).resolve())
            if not Path(model).exists():
                raise RlctlError(f"{model}: the pushed checkpoint is not on this host.", hint="run the eval again")
        elif step == 0:
            model = str(ev["base_model"])
        else:
            from rlctl.runs.checkpoints import find_checkpoints
            from rlctl.runs.state import read_state

            found = [c for c in find_checkpoints(read_state(run_dir).get("backend", ""), run_dir)
                     if c.complete and c.step == step]
            if not found:
                raise RlctlError(f"{run_dir.name} has no complete checkpoint at step {step} on this host.",
                                 hint=f"rlctl ckpt list {run_dir.name}")
            model = model_dir(found[0])
        out_dir = run_dir / EVALS
    else:
        model = staged.get(str(req["model"]), str(req["model"]))
        out_dir = (Path("rlctl-evals") / Path(str(req.get("name") or "model")).name).resolve()
    # a step the laptop lost when its connection was cut: that job (still running, or finished unclaimed) is
    # picked up rather than run twice
    adopted = adopt_job(ev, step, model, ev["sets"], out_dir, run_dir) if req.get("adopt") else None
    metrics, failure = adopted or run_job_here(ev, step, model, ev["sets"], out_dir, run_dir)
    _, out_file, log = job_files(out_dir, step)
    job = job_id(out_dir, step)
    # in place, the process the cut connection left may have recorded this job already (an ssh command gets no
    # SIGHUP): once only
    recorded = adopted is not None and run_dir is not None and any(
        isinstance(e, dict) and e.get("job") == job for e in read_ledger(run_dir).get("by_hand") or [])
    if req.get("in_place") and run_dir is not None and not recorded:
        record_by_hand(run_dir, step, metrics, failure, [s["name"] for s in ev["sets"]], job=job)
    result = None
    if out_file.is_file():
        try:
            result = json.loads(out_file.read_text())
        except ValueError:
            result = None
    return {"step": step, "model": model, "metrics": metrics, "error": failure, "result": result,
            "log_tail": log_tail(log), "log": str(log.resolve()), "adopted": adopted is not None,
            "job": job}


def stage_once(manifest: dict[str, str], token: str) -> Path:
    """The stage of these files (named by their hashes): made by the first request that needs it, reused after."""
    stage = Path(STAGE) / token
    if (stage / ".complete").is_file():
        return stage.resolve()
    if stage.exists():  # a stage left half-made by a cut connection: made again
        shutil.rmtree(stage)
    out = materialise(dict(manifest), token)
    (out / ".complete").write_text("")
    return out


VERBS = {
    "blobs": lambda req: {"missing": missing_blobs(list(req.get("sha256") or []))},
    "launch": remote_launch,
    "poll": lambda req: poll(list(req.get("run_dirs") or []), float(req.get("stall_after") or 1800),
                             bool(req.get("gpus"))),
    "ckpt": lambda req: (eval_picks(str(req["run_dir"]), [int(s) for s in req["steps"]]) if req.get("steps") is not None
                         else checkpoints(str(req["run_dir"]), req.get("step"), bool(req.get("list")))),
    "adopt": adopt_checkpoint,
    "eval": remote_eval,
    "files": lambda req: {"files": file_sets([str(p) for p in req.get("paths") or []])},
    "verify": lambda req: {"bad": verify_files(str(req["dest"]), list(req.get("files") or []))},
    "send": send,
    "record": record_result,
    "stage": lambda req: {"stage": str(stage_once(dict(req.get("manifest") or {}), str(req["token"])))},
}


def main(argv: list[str]) -> int:
    from rlctl import __version__

    if len(argv) != 1 or argv[0] not in VERBS:
        sys.stderr.write(f"rlctl: usage: python -m rlctl.executors.ssh_remote {{{','.join(VERBS)}}}\n")
        return 2
    req: dict[str, Any] = {}
    try:
        req = read_request()
        answer = VERBS[argv[0]](req)
    except RlctlError as e:
        sys.stderr.write(f"rlctl: {e}\n")
        return e.exit_code
    except OSError as e:
        import errno

        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # said as rlctl says a full disk (rlctl.runs.disk_full)
            from rlctl.runs.disk_full import full_while

            sys.stderr.write(f"rlctl: {full_while(f'writing {e.filename or argv[0]}', req.get('host'))}: "
                             f"{e.strerror}\n  fix: free space in the host's workdir, then run the command again\n")
            return 1
        sys.stderr.write(f"rlctl: {e.filename or ''}: {e.strerror or e}\n")
        return 2
    if isinstance(answer, dict):
        answer.setdefault("rlctl_version", __version__)
    sys.stdout.write(json.dumps(answer, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
