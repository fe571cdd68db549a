#!/usr/bin/env python3
"""docs/gpu.md's table of GPU runs, rebuilt from the evidence the kit's run script wrote on the GPU machine
(docs/gpu/<stack>-<n>.json). Nothing here is measured: every figure is read from those files.

    python scripts/gpu/report.py            # print the table
    python scripts/gpu/report.py --write    # put it into docs/gpu.md between its markers

A part still in progress when its call ended (`in_progress`) is left out: it measured nothing whole. Memory: the
NVML peak over the card's own use (the least NVML saw in the part's window), split by whether an rlctl evaluator
(EVAL_PROCS in NVML's process list) was on the GPU within a second and a half, against rlctl's plan from the part's
own `rlctl preflight --json` (memory.colocation: trainer + rollout vLLM; memory.gpus: + the evaluator's planned
footprint when it is planned beside the run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "gpu"
DOC = ROOT / "docs" / "gpu.md"
BEGIN, END = "<!-- gpu-runs:begin (scripts/gpu/report.py) -->", "<!-- gpu-runs:end -->"
GiB = 1024**3
# an evaluator on the GPU, as NVML's process list names it: its job process, and for TRL (whose colocated vLLM runs
# inside the trainer's own process) any vLLM engine process; verl's and OpenRLHF's rollout engines are processes too
EVAL_PROCS = {"trl-vllm": ("EngineCore", "rlctl.evals.job")}
OTHER_EVAL_PROCS = ("rlctl.evals.job",)


def evidence_files(folder: Path = EVIDENCE) -> list[Path]:
    """The run script's files: <stack>-<n>.json with a `written_by` of scripts/gpu/run.py."""
    out = []
    for p in sorted(folder.glob("*.json")):
        try:
            head = json.loads(p.read_text())
        except ValueError:
            continue
        if isinstance(head, dict) and head.get("written_by") == "scripts/gpu/run.py":
            out.append(p)
    return out


def _check(part: dict, name: str) -> dict | None:
    res = ((part.get("preflight") or {}).get("json") or {}).get("results") or []
    return next((r for r in res if r.get("check") == name), None)


def planned(part: dict) -> dict[str, float]:
    """rlctl's plan for the GPU, from the part's preflight: trainer + rollout vLLM, and + the evaluator."""
    out: dict[str, float] = {}
    trainer = _check(part, "memory.trainer")
    colo = _check(part, "memory.colocation")
    if colo and colo.get("data"):
        d = colo["data"]
        out["run"] = (d["trainer_peak"] + (d["vllm_budget"] if d.get("mode") == "resident" else 0)) / GiB
        if d.get("mode") == "sleep":  # the larger of rollout (trainer resident + engine) and training phases
            out["run"] = max(d["trainer_resident"] + d["vllm_budget"], d["trainer_peak"]) / GiB
    elif trainer and trainer.get("data"):
        out["run"] = trainer["data"]["per_gpu_bytes"] / GiB
    gpus = _check(part, "memory.gpus")
    ev = ((gpus or {}).get("data") or {}).get("eval") or {}
    if "run" in out and ev.get("footprint_beside_gib") and ev.get("device") is None:
        out["with_eval"] = out["run"] + ev["footprint_beside_gib"]
    return out


def per_gpu(part: dict) -> str | None:
    """Where the backend's scheduler placed shares of different sizes (OpenRLHF's actor on one GPU, its engine on
    another: Ray picks which), each GPU's plan against each GPU's NVML peak over its first reading, matched by size;
    None where the plan has one share per GPU of one kind."""
    data = (_check(part, "memory.gpus") or {}).get("data") or {}
    shares = sorted(g["total_gib"] for g in data.get("gpus") or [])
    win = part.get("later_window") if part.get("ended_in_later_call") else None
    win = part.get("nvml_window") or win or {}
    if data.get("placed") or len(set(shares)) < 2 or not win.get("peak_gib"):
        return None
    peaks = sorted(p - f for p, f in zip(win["peak_gib"], win["first_gib"], strict=False))[-len(shares):]
    return "; ".join(ratio(s, m) for s, m in zip(shares, peaks, strict=False))


def call_of(doc: dict, part: dict) -> dict:
    """The NVML record of the call that ran the part: the one its `call_started` names, else (evidence written
    before parts named it) the one whose samples agree with the NVML readings the part's events took."""
    import bisect

    calls = (doc.get("nvml") or {}).get("calls") or []
    if part.get("call_started") is not None:
        return next((c for c in calls if c.get("started") == part["call_started"]), {})
    events = [(e["t"], e["used_gib"][0]) for e in part.get("events") or [] if e.get("used_gib")]

    def miss(call: dict) -> float:
        ts = [s[0] for s in call.get("samples", [])]
        if not ts or not events:
            return float("inf")
        total = 0.0
        for t, used in events:
            i = min(bisect.bisect_left(ts, t), len(ts) - 1)
            total += abs(call["samples"][i][1] - used) if abs(ts[i] - t) < 1 else 100.0
        return total
    return min(calls, key=miss, default={})


def measured(doc: dict, part: dict) -> dict[str, float]:
    """NVML peaks of the part's window over the first sample, apart with and without an evaluator on the GPU."""
    t0, t1 = (part.get("t") or [None, None])[:2]
    if t0 is None:
        return {}
    call = call_of(doc, part)
    samples = [s for s in call.get("samples", []) if t0 <= s[0] <= t1]
    if not samples:
        return {}
    marks = EVAL_PROCS.get(doc.get("stack"), OTHER_EVAL_PROCS)
    evals = sorted(p["t"] for p in call.get("processes", []) if any(m in p.get("cmd", "") for m in marks)
                   and t0 <= p["t"] <= t1)
    # the card's own use: the least NVML saw in the window (a reading right before `rlctl launch` can hold an
    # evaluator of the previous run still finishing: trl-vllm-2's LoRA started beside 2.2 GiB of one); each GPU
    # apart, and a sample's figure is its busiest GPU's (the plan is per GPU: 2 GPUs of verl hold one share each)
    cols = range(1, len(samples[0]))
    bases = {c: min(s[c] for s in samples) for c in cols}
    base = bases[1]
    samples = [[s[0], base + max(s[c] - bases[c] for c in cols)] for s in samples]

    def near_eval(t: float) -> bool:
        import bisect

        i = bisect.bisect_left(evals, t - 1.5)
        return i < len(evals) and evals[i] <= t + 1.5
    alone = [s[1] for s in samples if not near_eval(s[0])]
    beside = [s[1] for s in samples if near_eval(s[0])]
    out = {"base": base}
    if alone:
        out["run"] = max(alone) - base
    if beside:
        out["with_eval"] = max(beside) - base
    later = part.get("later_window") or {}
    if later.get("peak_gib") and not beside:  # the rest of the run, seen by a later call (no evaluator to split)
        out["run"] = max(out.get("run", 0.0), max(p - bases.get(i + 1, base) for i, p in
                                                  enumerate(later["peak_gib"])))
    return out


def kills(part: dict) -> str:
    ev = part.get("events") or []
    out = []
    for i, e in enumerate(ev):
        if not e["what"].startswith("kill"):
            continue
        nxt = next((x for x in ev[i + 1:] if x["what"].endswith("started")), None)
        if nxt is None:
            out.append(f"{e['what'].split()[1]} at step {e['at_step']}: no next attempt")
            continue
        rec = nxt.get("attempt_record") or {}
        used = ", ".join(f"{u:.1f}" for u in nxt.get("used_gib") or [])
        procs = len(nxt.get("processes") or [])
        out.append(f"{e['what'].split()[1]} at step {e['at_step']}: attempt {rec.get('attempt')} from step "
                   f"{rec.get('from_step')}, GPU {used} GiB / {procs} process(es) at its start")
    return "; ".join(out) or "none"


def outcome(part: dict) -> str:
    st = ((part.get("collected") or {}).get("state")) or {}
    atts = st.get("attempts") or []
    fails = [f"#{a['attempt']} {a.get('outcome')} (exit {a.get('exit_code')})" for a in atts
             if a.get("outcome") not in ("finished", None)]
    return f"{st.get('status')}, {len(atts)} attempt(s)" + (f": {', '.join(fails)}" if fails else "")


def evals(part: dict) -> str:
    c = part.get("collected") or {}
    ledger = ((c.get("evals") or {}).get("evals.json")) or {}
    done = ledger.get("done") or {}
    ok = sorted(int(k) for k, v in done.items() if v.get("outcome") == "ok")
    bad = sorted(int(k) for k, v in done.items() if v.get("outcome") != "ok")
    out = []
    if done:
        out.append(f"in-run ok at {ok}" + (f", failed at {bad}" if bad else ""))
    elif c.get("metrics"):  # no rlctl evaluator: the backend's own in-loop eval, as `rlctl metrics` read it
        lines = [ln.split(",") for ln in (c["metrics"].get("stdout") or "").splitlines()[1:]]
        steps = sorted({int(x[0]) for x in lines if len(x) == 4 and x[2] == "eval/default/greedy_pass@1"})
        if steps:
            out.append(f"backend's in-loop eval at {steps}")
    after = part.get("eval_after") or {}
    if after.get("skipped"):
        out.append(f"`rlctl eval` not run: {after['skipped']}")
    if "exit" in after:
        res = ((after.get("json") or {}).get("results") or [{}])[0]
        m = res.get("metrics") or {}
        argv = after.get("argv") or []
        step = res.get("step") if res.get("step") is not None else (argv[argv.index("--step") + 1]
                                                                    if "--step" in argv else None)
        said = res.get("error") or ("" if after["exit"] == 0 else
                                    (after.get("stderr") or "").strip().splitlines()[:1] or [""])
        said = said if isinstance(said, str) else said[0]
        out.append(f"`rlctl eval --step {step}`: exit {after['exit']}, {len(m)} metrics"
                   + (f", {said[:160]}" if said else "")
                   + (" (a later call)" if after.get("later_call") else ""))
    return "; ".join(out) or "-"


def ratio(plan: float | None, meas: float | None) -> str:
    if meas is not None and meas >= 0.5 and not plan:
        return f"not planned: NVML peak {meas:.1f}"
    if not plan or not meas or meas < 0.5:  # below 0.5 GiB the run never reached the GPU
        return "-"
    r = plan / meas
    word = "within ±10%" if abs(r - 1) <= 0.10 else ("plan over" if r > 1 else "plan UNDER")
    return f"{plan:.1f} / {meas:.1f} = {r:.2f} ({word})"


def with_later_calls(doc: dict) -> dict[str, dict]:
    """The parts, each run cut short by its call's time completed by the first later call (`--part collect`) that
    waited for it to its end: its final state, steps, and that call's NVML window."""
    later: dict[str, dict] = {}
    for name, part in doc["parts"].items():
        if name.split("#")[0] == "collect":
            for run, entry in part.items():
                if isinstance(entry, dict) and "collected" in entry:
                    later.setdefault(run, entry)
    # `--part eval-runs`: rlctl eval of a run's checkpoint in a later call, where the part's own call had no time
    evals_later: dict[str, dict] = {}
    for name, part in doc["parts"].items():
        if name.split("#")[0] == "eval-runs":
            for run, entry in part.items():
                if isinstance(entry, dict) and "exit" in (entry.get("eval_after") or {}):
                    evals_later.setdefault(run, entry["eval_after"])
    out = {}
    for name, part in doc["parts"].items():
        run = (part.get("collected") or {}).get("run_dir")
        if run in later:
            part = {**part, "collected": later[run]["collected"], "steps": later[run].get("steps"),
                    "later_window": later[run].get("nvml_window"), "ended_in_later_call": True}
        if run in evals_later and "exit" not in (part.get("eval_after") or {}):
            part = {**part, "eval_after": {**evals_later[run], "later_call": True}}
        out[name] = part
    return out


def rows(files: list[Path]) -> list[list[str]]:
    out = []
    for f in files:
        doc = json.loads(f.read_text())
        doc = {**doc, "parts": with_later_calls(doc)}
        v = doc.get("versions") or {}
        stack = doc["stack"]
        own = {"trl-vllm": ("trl",), "verl": ("verl", "ray"), "openrlhf": ("openrlhf", "deepspeed", "ray"),
               "prime-rl": ("prime-rl", "verifiers", "transformers")}
        ver = f"vLLM {v.get('vllm')}" + "".join(f", {k} {v[k]}" for k in own.get(stack, ()) if v.get(k))
        gpu = ", ".join(sorted(set((doc.get("machine") or {}).get("gpus") or []))) or "-"
        for name, part in doc["parts"].items():
            if part.get("in_progress") or "recipe" not in part:
                continue
            if "collected" not in part:
                launch = part.get("launch") or {}
                refused = [ln.strip()[:120] for ln in (launch.get("stdout") or "").splitlines()
                           if ln.startswith("FAIL")]
                why = part.get("error") or part.get("kill_error") or (
                    f"launch refused by preflight: {refused[0]}" if refused else "not launched")
                out.append([f.name, name, ver, gpu, why,
                            "-", "-", "-", "-", "-"])
                continue
            st = part.get("steps") or {}
            seen = st.get("seen") or {}
            steps = f"{len(seen)}/{len(st.get('expected') or [])}" + (", each once" if st.get("each_once") else
                                                                       (", repeats" if any(c > 1 for c in
                                                                                           seen.values()) else ""))
            p, m = (planned(part), measured(doc, part)) if seen else ({}, {})  # never trained: nothing to compare
            end = " (its end seen by a later call)" if part.get("ended_in_later_call") else ""
            mem = (per_gpu(part) if seen else None) or ratio(p.get("run"), m.get("run"))
            beside = ratio(p.get("with_eval"), m.get("with_eval"))
            if name.split("#")[0] in STAND_IN_TRAINERS:
                mem, beside = "- (a stand-in trainer: no plan to test)", "-"
            out.append([f.name, name, ver, gpu, outcome(part) + end, steps, kills(part), mem, beside,
                        evals(part)])
    return out


# parts whose trainer is a script of the kit's own (seed 004's engine-dies: a loop waiting on a vLLM server), not a
# backend's: their memory says nothing of rlctl's plan
STAND_IN_TRAINERS = {"engine-dies"}

HEAD = ["evidence", "part", "versions", "GPU", "outcome", "steps logged", "kills -> restart (GPU at restart)",
        "memory: plan / NVML peak (GiB), run alone", "... with rlctl's evaluator beside it", "evals"]


def table(files: list[Path] | None = None) -> str:
    body = rows(files if files is not None else evidence_files())
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in body]
    return "\n".join(lines)


def render_doc(text: str, tbl: str) -> str:
    a, b = text.index(BEGIN), text.index(END)
    return text[:a + len(BEGIN)] + "\n" + tbl + "\n" + text[b:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="update docs/gpu.md in place")
    args = ap.parse_args(argv)
    tbl = table()
    if args.write:
        DOC.write_text(render_doc(DOC.read_text(), tbl))
    else:
        print(tbl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
