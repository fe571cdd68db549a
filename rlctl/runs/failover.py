"""Failover: what a watcher (`rlctl watch`, an experiment's queue) does each time it looks at a pool run
(docs/resilience.md).

A pool run's record here (runs/<name>/state.json) holds its pool (places, failover_after_s, on_event, the sync store,
what the plan needs) and its lineage: one entry per attempt placed somewhere (#1 on box1, #2 on box2 from step 30...).
Each look:

1. the current attempt's place is asked through its executor (one round trip): alive, ended, unreachable, or gone
   (it answers without the run's processes, or without its run directory, or with its processes alive on GPUs that
   are gone: "running");
2. unreachable for longer than `failover_after_s`, or gone: the run fails over. The newest complete checkpoint it
   can reach (the store's, as fencing reads it, or a copy `rlctl ckpt pull` brought here: the newer of the two),
   the next generation claimed in the store (rlctl.runs.fencing: two watchers never launch the same run twice, and
   the old attempt stops itself when it sees the claim; one gone while its processes still run is stopped there
   once the claim is made, before the next attempt starts), a place of the pool that fits the plan, the run's
   stream up to that step and its W&B run id carried over; on_event `failover`;
3. an earlier attempt's place that answers again: its attempt is stopped there if it still runs, or what became of
   it is said (it stopped itself on learning from the store that it was superseded);
4. the run ended: on_event `finish` (or `death`, which also fires when no place of the pool can take a run whose
   place is gone), once.

Everything it knows is in the run record and the store, so a watcher killed at any point and started again goes on
where it was. Which places exist and how they are asked is the executor's (its pick_place, probe, relaunch and
stop_attempt verbs); this module names none.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.core.state import read_state, write_state
from rlctl.errors import RlctlError

ENDED = ("finished", "failed", "stopped")
LAUNCH_WINDOW_S = 300.0  # a relaunch recorded as in flight by a watcher that died: given up after this


def _hhmm(t: Any) -> str:
    return time.strftime("%H:%M", time.localtime(float(t))) if isinstance(t, (int, float)) else "?"


def lineage_of(state: dict[str, Any]) -> list[dict[str, Any]]:
    lin = state.get("lineage")
    return [e for e in lin if isinstance(e, dict)] if isinstance(lin, list) else []


def lineage_lines(state: dict[str, Any]) -> list[str]:
    """How `rlctl status RUN` tells a pool run's lineage: "#2 on box2 from step 30; box1 gone since 10:42 (...)"."""
    pool = state.get("pool")
    lin = lineage_of(state)
    if not isinstance(pool, dict) or not lin:
        return []
    store = f"checkpoints in {pool['sync']}" if pool.get("sync") else \
        "no checkpoint.sync: a failover starts from a copy pulled here, or step 0"
    hosts = pool.get("hosts") if isinstance(pool.get("hosts"), list) else []
    after = pool.get("failover_after_s")
    after = f"{after:g}" if isinstance(after, (int, float)) and not isinstance(after, bool) else "?"
    out = [f"  pool: {', '.join(str(h) for h in hosts)} (failover after {after} s without its host; {store})"]
    prev: dict[str, Any] | None = None
    for e in lin:
        frm = f"from step {e['from_step']}" if e.get("from_step") is not None else "from the start"
        line = f"  #{e.get('generation')} on {e.get('host')} {frm}"
        if prev is not None and prev.get("gone_since"):
            line += (f"; {prev.get('host')} unreachable since {_hhmm(prev['gone_since'])}" if _unreachable(prev) else
                     f"; {prev.get('host')} answered without the run since {_hhmm(prev['gone_since'])}")
            if prev.get("gone_why"):
                line += f" ({prev['gone_why']})"
        if e.get("launching"):
            line += " (starting)"
        out.append(line)
        if e.get("settled"):
            out.append(f"     {e['settled']}")
        prev = e
    return out


def lineage_attempts(state: dict[str, Any], attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A pool run's attempts as `rlctl status` lists them: each generation on its host, where it started (the step
    the lineage says), then the current host's own restarts. The current host's record alone starts at its launch
    "from the start", though that launch resumed from the lineage's checkpoint."""
    lin = [e for e in lineage_of(state) if not e.get("launching")]
    if len(lin) < 2:
        return attempts
    out: list[dict[str, Any]] = []
    for i, e in enumerate(lin[:-1]):
        end = e.get("settled") or (f"unreachable since {_hhmm(e['gone_since'])}" if _unreachable(e) else
                                   f"its processes gone since {_hhmm(e.get('gone_since'))}")
        out.append({"attempt": i + 1, "generation": e.get("generation"), "host": e.get("host"),
                    "started_at": e.get("started_at"), "reason": "launch" if i == 0 else "failover",
                    "from_step": e.get("from_step"), "from_checkpoint": e.get("from") if i else None,
                    "outcome": end})
    cur = lin[-1]
    for j, a in enumerate(attempts):
        a = {**a, "attempt": len(out) + 1, "generation": cur.get("generation"), "host": cur.get("host")}
        if j == 0:  # its launch resumed where the lineage says
            a.update(reason="failover", from_step=a.get("from_step") if a.get("from_step") is not None
                     else cur.get("from_step"), from_checkpoint=a.get("from_checkpoint") or cur.get("from"))
        out.append(a)
    if not attempts:
        out.append({"attempt": len(out) + 1, "generation": cur.get("generation"), "host": cur.get("host"),
                    "started_at": cur.get("started_at"), "reason": "failover", "from_step": cur.get("from_step"),
                    "from_checkpoint": cur.get("from")})
    return out


def _unreachable(e: dict[str, Any]) -> bool:
    """Was this attempt's host unreachable (rather than answering without the run's processes)?"""
    if "host_answered" in e:
        return not e["host_answered"]
    return str(e.get("gone_why") or "").startswith("unreachable")


def _records(text: str) -> list[dict[str, Any]]:
    import json

    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _spans(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7"."""
    out, start, prev = [], steps[0], steps[0]
    for s in [*steps[1:], None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        out.append(f"{start}-{prev}" if prev != start else str(start))
        if s is not None:
            start = prev = s
    return ", ".join(out)


class Failover:
    """One pool run as a watcher sees it. `pick(exclude)` -> (place or None, notes) chooses where a failover goes
    (default: the first place of the pool, not excluded, that fits the plan, as the executor reads its facts)."""

    def __init__(self, run_dir: Path, out: Any = None,
                 pick: Callable[[set[str]], tuple[str | None, list[str]]] | None = None):
        self.run_dir = run_dir
        self.out = out or sys.stdout
        self.pick = pick
        self._old_at = 0.0  # when earlier attempts' places were last asked

    def say(self, msg: str) -> None:
        self.out.write(f"{time.strftime('%H:%M:%S')} {self.run_dir.name}: {msg}\n")
        self.out.flush()

    # ---- one look ---------------------------------------------------------------------------------------------
    def step(self) -> str:
        """Look at the run once and act on what is seen; returns its status (ended ones: finished/failed/stopped)."""
        st = read_state(self.run_dir)
        pool = st.get("pool")
        if not isinstance(pool, dict):  # an ordinary run (the queue asks of all its runs): nothing to move
            from rlctl.runs.state import settled_status

            return settled_status(self.run_dir, st)
        from rlctl import executors

        ex = executors.get(str(pool.get("executor") or st.get("executor")))
        self._adopt(pool)
        st = read_state(self.run_dir)
        lineage = lineage_of(st)
        if not lineage:
            return str(st.get("status") or "unknown")
        self._old_attempts(ex, pool)
        st = read_state(self.run_dir)
        if st.get("status") in ENDED:
            self._ended(st, str(st["status"]))
            return str(st["status"])
        cur = lineage_of(st)[-1]
        if cur.get("launching"):
            return self._launch_in_flight(ex, pool, cur)
        seen = ex.probe(self.run_dir, cur["ref"], current=True)
        st = read_state(self.run_dir)
        if seen["state"] == "alive":
            if st.get("unreachable_since"):
                self.say(f"{cur['host']} answers again")
                write_state(self.run_dir, unreachable_since=None, unreachable_seen_at=None)
            return str(seen.get("status") or "running")
        if seen["state"] == "ended":
            status = str(seen.get("status"))
            write_state(self.run_dir, status=status, unreachable_since=None)
            self._ended(read_state(self.run_dir), status)
            return status
        now = time.time()
        limit = float(pool.get("failover_after_s") or 300)
        since = float(st.get("unreachable_since") or now)
        if now - float(st.get("unreachable_seen_at") or now) > 2 * limit:
            since = now  # nobody looked for a while (a laptop asleep): the count starts again, from what is seen now
        if seen["state"] == "unreachable":
            if not st.get("unreachable_since") or since == now:
                self.say(f"{cur['host']} unreachable ({seen.get('why')}); the run fails over if it stays so for "
                         f"{limit:g} s")
            write_state(self.run_dir, unreachable_since=since, unreachable_seen_at=now)
            if now - since < limit:
                return "unreachable"
            why = f"unreachable for {now - since:.0f} s"
        else:
            why = str(seen.get("why"))
        return self._fail_over(ex, pool, why, since, running=bool(seen.get("running")))

    # ---- moving the run ---------------------------------------------------------------------------------------
    def _fail_over(self, ex: Any, pool: dict[str, Any], why: str, since: float, running: bool = False) -> str:
        """Move the run to the next place; `running`: the attempt left behind still runs where it is (its place
        answers, its GPUs are gone) and is stopped there once the next generation is claimed."""
        from rlctl.runs import fencing

        st = read_state(self.run_dir)
        lineage = lineage_of(st)
        cur = lineage[-1]
        limit = float(pool.get("failover_after_s") or 300)
        tried = {e["host"] for e in st.get("failover_errors") or [] if isinstance(e, dict)
                 and time.time() - float(e.get("at") or 0) < limit}
        exclude = {str(cur["host"])} | tried
        source = self._checkpoint(st, pool)
        total = st.get("total_steps")
        if type(source.get("step")) is int and type(total) is int and 0 < total <= source["step"]:
            return self._finished_at(st, source, why)  # its final checkpoint is there: nothing left to train
        if self.pick is not None:
            place, notes = self.pick(exclude)
        else:
            place, notes = ex.pick_place(list(pool.get("hosts") or []), pool.get("needs") or {}, exclude)
        if place is None and tried:
            return "restarting"  # a launch there failed a moment ago: tried again after failover_after_s
        if place is None:
            reason = (f"{cur['host']} gone ({why}) and no other host of the pool can take the run"
                      + (f": {'; '.join(notes)}" if notes else ""))
            if st.get("no_place_for") != cur.get("generation"):
                self.say(reason + " (it waits: a host added to the pool, or this one back, takes it)")
                write_state(self.run_dir, no_place_for=cur.get("generation"))
            self._fire(st, "death", f"death:{cur.get('generation')}", host=None, from_host=cur.get("host"),
                       generation=cur.get("generation"), reason=reason)
            return "unreachable"
        for n in notes:
            self.say(n)
        token = fencing.new_token()
        g = int(cur.get("generation") or 1) + 1
        fence = None
        held = st.get("claim") if isinstance(st.get("claim"), dict) else None  # a claim whose launch failed
        if pool.get("sync") and held and self._still_current(pool, held):
            g, token = int(held["generation"]), str(held["token"])
            fencing.amend(str(pool["sync"]), g, token, host=place, from_step=source.get("step"),
                          from_manifest=source.get("manifest"))
            fence = fencing.fence_spec(str(pool["sync"]), held, place, limit)
        elif pool.get("sync"):
            try:
                rec = fencing.claim(str(pool["sync"]), {
                    "host": place, "token": token, "from_step": source.get("step"),
                    "from_manifest": source.get("manifest"), "ref": None, "run": self.run_dir.name})
            except fencing.ClaimLost as e:
                self.say(f"{e.message}: not launched again here")
                return "restarting"
            except Exception as e:
                self.say(f"could not claim the next generation in {pool['sync']} ({type(e).__name__}: {e}); the run "
                         "is not moved while the store cannot fence it")
                return "unreachable"
            g = int(rec["generation"])
            fence = fencing.fence_spec(str(pool["sync"]), rec, place, limit)
            write_state(self.run_dir, claim={"generation": g, "token": token})
        gone = {**cur, "gone_since": since, "gone_why": why, "host_answered": not why.startswith("unreachable")}
        if running:  # it cannot progress, and fenced now, it is stopped before the next attempt starts
            gone["settled"] = self._stop_stuck(ex, cur)
            if not gone["settled"]:
                gone.pop("settled")
        entry = {"generation": g, "token": token, "host": place, "ref": None, "from_step": source.get("step"),
                 "from": source["words"], "started_at": time.time(), "launching": True}
        write_state(self.run_dir, lineage=[*lineage[:-1], gone, entry], status="restarting")
        lineage_opts: dict[str, Any] = {"generation": g, "token": token, "wandb_run_id": st.get("wandb_run_id"),
                                        "from_step": source.get("step"), "stream": self._stream(source)}
        if fence:
            lineage_opts["fence"] = fence
        where = f"step {source['step']}" if source.get("step") is not None else "the start"
        self.say(f"moving the run to {place} (#{g}), from {where} ({source['words']})")
        try:
            ref = ex.relaunch(self.run_dir, place, lineage_opts, source, self.out)
        except RlctlError as e:
            errors = [*(st.get("failover_errors") or []), {"host": place, "at": time.time(), "error": e.message}]
            write_state(self.run_dir, lineage=[*lineage[:-1], gone], failover_errors=errors[-20:])
            self.say(f"could not start #{g} on {place}: {e.message}; another host is tried next")
            return "restarting"
        entry.pop("launching")
        entry["ref"] = ref
        write_state(self.run_dir, lineage=[*lineage[:-1], gone, entry], unreachable_since=None, failover_errors=None,
                    no_place_for=None, claim=None)
        if pool.get("sync"):
            fencing.amend(str(pool["sync"]), g, token, ref=ref)
        self.say(f"#{g} on {place} from {where}; {cur['host']} gone since {_hhmm(since)} ({why})")
        self._fire(read_state(self.run_dir), "failover", f"failover:{g}", host=place, from_host=cur.get("host"),
                   step=source.get("step"), generation=g, reason=why)
        return "running"

    def _finished_at(self, st: dict[str, Any], source: dict[str, Any], why: str) -> str:
        """A run whose newest complete checkpoint is its last step has trained every step (train.steps): it is
        finished, whatever became of its host after that save; no attempt is started anywhere."""
        note = f"nothing left to train: the checkpoint is at step {source['step']} of {st['total_steps']}"
        self.say(f"{lineage_of(st)[-1].get('host')} gone ({why}); {note} ({source['words']}): the run is finished")
        write_state(self.run_dir, status="finished", exit_code=0, ended_at=time.time(), outcome="finished",
                    nothing_left=note, nothing_left_at=source["step"], unreachable_since=None)
        self._ended(read_state(self.run_dir), "finished")
        return "finished"

    def _stop_stuck(self, ex: Any, cur: dict[str, Any]) -> str | None:
        """Stop an attempt whose place answers but which cannot progress; what became of it, or None (not stopped:
        a later look at earlier attempts tries again)."""
        try:
            ex.stop_attempt(cur["ref"], 10.0)
        except RlctlError as err:
            self.say(f"{cur['host']} answers, but its attempt #{cur['generation']} there could not be stopped: "
                     f"{err.message} (it is fenced: it writes no checkpoint, latest or W&B record)")
            return None
        self.say(f"stopped its attempt #{cur['generation']} there (its processes still ran on {cur['host']})")
        return "stopped by rlctl watch: its processes still ran, on GPUs that were gone"

    def _still_current(self, pool: dict[str, Any], held: dict[str, Any]) -> bool:
        """Our claim of a generation whose launch failed is still the store's newest: the next try reuses it."""
        from rlctl.runs import fencing
        from rlctl.runs.sync import store

        try:
            fs, root = store(str(pool["sync"]))
            cur = fencing.current(fs, root, int(held["generation"]))
        except Exception:
            return False
        return cur is not None and cur.get("generation") == held["generation"] and cur.get("token") == held["token"]

    def _launch_in_flight(self, ex: Any, pool: dict[str, Any], cur: dict[str, Any]) -> str:
        """A watcher died while starting attempt #g: find it where it was being started, or give it up."""
        st = read_state(self.run_dir)
        lineage = lineage_of(st)
        ref = ex.attempt_ref(self.run_dir, cur["host"], int(cur["generation"]))
        seen = ex.probe(self.run_dir, ref, current=True)
        if seen["state"] in ("alive", "ended"):
            cur = {k: v for k, v in cur.items() if k != "launching"}
            cur["ref"] = ref
            write_state(self.run_dir, lineage=[*lineage[:-1], cur], unreachable_since=None)
            if pool.get("sync"):
                from rlctl.runs import fencing

                fencing.amend(str(pool["sync"]), int(cur["generation"]), str(cur["token"]), ref=ref)
            self.say(f"#{cur['generation']} on {cur['host']} was started by a watcher that died: taken over")
            return str(seen.get("status") or "running")
        if time.time() - float(cur.get("started_at") or 0) < LAUNCH_WINDOW_S and seen["state"] == "unreachable":
            return "restarting"
        prev = lineage[-2] if len(lineage) > 1 else None
        write_state(self.run_dir, lineage=lineage[:-1])
        self.say(f"#{cur['generation']} on {cur['host']} never started ({seen.get('why') or seen['state']}); "
                 "moving the run again")
        if prev is None:
            return "unreachable"
        return self._fail_over(ex, pool, str(prev.get("gone_why") or "gone"), float(prev.get("gone_since") or
                                                                                     time.time()))

    def _checkpoint(self, st: dict[str, Any], pool: dict[str, Any]) -> dict[str, Any]:
        """The newest complete checkpoint the run can resume from: the store's (as fencing reads it) or one pulled
        here (`rlctl ckpt pull`), whichever is newer (the store on a tie: nothing to send from here)."""
        from rlctl.runs.checkpoints import find_checkpoints

        synced = None
        if pool.get("sync"):
            from rlctl.runs.sync import read_latest

            try:
                synced = read_latest(str(pool["sync"]))
            except Exception as e:
                self.say(f"the store {pool['sync']} could not be read ({type(e).__name__}: {e})")
        here = [c for c in find_checkpoints(str(st.get("backend") or ""), self.run_dir) if c.complete]
        local = here[-1] if here else None
        if synced is not None and (local is None or int(synced["step"]) >= local.step):
            return {"kind": "store", "url": pool["sync"], "manifest": synced["manifest"], "step": int(synced["step"]),
                    "words": f"the copy in {pool['sync']}", "_manifest": synced}
        if local is not None:
            return {"kind": "local", "step": local.step, "words": "the copy on this machine (rlctl ckpt pull)"}
        return {"kind": None, "step": None, "words": "no complete checkpoint it can reach"}

    def _stream(self, source: dict[str, Any]) -> str:
        """The run's stream up to the step it resumes from: as synced with that checkpoint, else this machine's
        mirror of it."""
        from rlctl.runs.sync import read_stream, stream_upto

        if source.get("step") is None:
            return ""
        data = None
        if source.get("kind") == "store":
            try:
                data = read_stream(str(source["url"]), source["_manifest"])
            except Exception:
                data = None
        here = stream_upto(self.run_dir, int(source["step"]))
        if data is None:
            data = here
        elif here:  # steps the synced copy lacks, from this machine's mirror (each step's records from one place)
            import json

            have = {r.get("step") for r in _records(data.decode("utf-8", errors="replace"))}
            extra = [r for r in _records(here.decode("utf-8", errors="replace")) if r.get("step") not in have]
            if extra:
                merged = _records(data.decode("utf-8", errors="replace")) + extra
                merged.sort(key=lambda r: (r.get("step") if isinstance(r.get("step"), int) else -1))
                data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in merged).encode()
        text = data.decode("utf-8", errors="replace")
        steps = {r.get("step") for r in _records(text)}
        missing = [s for s in range(1, int(source["step"]) + 1) if s not in steps]
        if missing and len(missing) < int(source["step"]):
            self.say(f"the stream carried over lacks step(s) {_spans(missing)}: they were never read from the old "
                     "host; rlctl logs RUN --metrics shows the rest")
        elif missing:
            self.say(f"no record of steps 1-{source['step']} reached this machine: the new attempt's stream starts "
                     f"at step {int(source['step']) + 1}")
        return text

    # ---- earlier attempts, events -----------------------------------------------------------------------------
    def _old_attempts(self, ex: Any, pool: dict[str, Any]) -> None:
        """Earlier attempts not known to have ended: where their place answers again, stop what still runs there
        and say what became of each."""
        every = min(60.0, float(pool.get("failover_after_s") or 300))
        if time.time() - self._old_at < every:
            return
        self._old_at = time.time()
        lineage = lineage_of(read_state(self.run_dir))
        if len(lineage) < 2:
            return
        cur = lineage[-1]
        changed = False
        for e in lineage[:-1]:
            if e.get("settled") or not e.get("ref"):
                continue
            seen = ex.probe(self.run_dir, e["ref"], current=False)
            if seen["state"] == "unreachable":
                continue
            back = f"{e['host']} is back" if str(e.get("gone_why") or "").startswith("unreachable") else \
                f"{e['host']} answers"
            at = f" at step {seen['step']}" if seen.get("step") is not None else ""
            if seen["state"] == "alive" or seen.get("running"):  # "running": gone, its processes still there
                try:
                    ex.stop_attempt(e["ref"], 10.0)
                except RlctlError as err:
                    self.say(f"{back}, but its attempt #{e['generation']} there could not be stopped: {err.message}")
                    continue
                e["settled"] = f"stopped by rlctl watch{at}, when {e['host']} answered again"
                self.say(f"{back}: stopped its attempt #{e['generation']} there (it still ran{at}); "
                         f"#{cur['generation']} on {cur['host']} holds the run")
            elif seen["state"] == "ended" and seen.get("outcome") == "superseded":
                by = seen.get("superseded_by") or {}
                e["settled"] = f"stopped itself{at}: superseded by #{by.get('generation')} on {by.get('host')}"
                self.say(f"{back}: its attempt #{e['generation']} had stopped itself{at} (superseded by "
                         f"#{by.get('generation')} on {by.get('host')}); nothing to stop")
            elif seen["state"] == "ended":
                e["settled"] = f"ended there ({seen.get('status')}){at}"
                self.say(f"{back}: its attempt #{e['generation']} had ended ({seen.get('status')}){at}")
            else:
                e["settled"] = ("gone with its host: it answers again without the run's processes" if _unreachable(e)
                                else f"its processes gone; {e['host']} answers")
                self.say(f"{back} without the run's processes: nothing of attempt #{e['generation']} runs there")
            changed = True
        if changed:
            write_state(self.run_dir, lineage=lineage)

    def _adopt(self, pool: dict[str, Any]) -> None:
        """Another watcher (elsewhere, with its own copy of the record) moved the run: the store says where."""
        if not pool.get("sync"):
            return
        from rlctl.runs import fencing
        from rlctl.runs.sync import store

        lineage = lineage_of(read_state(self.run_dir))
        if not lineage:
            return
        last = int(lineage[-1].get("generation") or 1)
        try:
            fs, root = store(str(pool["sync"]))
            if fencing.read_generation(fs, root, last + 1) is None:
                return
            newer = [r for r in fencing.history(fs, root) if int(r.get("generation") or 0) > last and r.get("ref")]
        except Exception:
            return
        if not newer or lineage[-1].get("launching"):
            return
        added = [{"generation": r["generation"], "token": r.get("token"), "host": r.get("host"), "ref": r["ref"],
                  "from_step": r.get("from_step"), "started_at": r.get("claimed_at"),
                  "moved_by": r.get("by")} for r in newer]
        write_state(self.run_dir, lineage=[*lineage, *added], unreachable_since=None)
        for r in added:
            self.say(f"#{r['generation']} on {r['host']} (moved there by another watcher: {r.get('moved_by')})")

    def _ended(self, st: dict[str, Any], status: str) -> None:
        event = {"finished": "finish", "failed": "death"}.get(status)
        if event:
            self._fire(st, event, f"{event}:end", host=st.get("host"), step=(st.get("remote_summary") or {}).get(
                "step"), reason=st.get("gave_up") or st.get("error"))

    def _fire(self, st: dict[str, Any], event: str, key: str, **fields: Any) -> None:
        """on_event, once per key (the record keeps which fired: a watcher restarted does not fire them again).
        Every event has the generation (and host) of the attempt it is about: the lineage's newest."""
        lin = lineage_of(st)
        if lin:
            if fields.get("generation") is None:
                fields["generation"] = lin[-1].get("generation")
            if "host" in fields and fields["host"] is None and event != "death":
                fields["host"] = lin[-1].get("host")
        fired = [k for k in st.get("events_fired") or [] if isinstance(k, str)]
        if key in fired:
            return
        write_state(self.run_dir, events_fired=[*fired, key])
        cmd = (st.get("pool") or {}).get("on_event")
        if cmd:
            from rlctl.runs.on_event import fire

            fire(self.run_dir, str(cmd), event, **fields)
