"""One eval job: every due set on one model (a checkpoint, or the base model at step 0), in its own process.

    python -m rlctl.evals.job SPEC.json

The job is an argv and a spec file, so it runs the same on this machine, on another GPU index
(CUDA_VISIBLE_DEVICES) or on another host. It writes `spec["output"]`:
{"step": N, "model": ..., "engine": ..., "metrics": {"eval/<set>/<mode>": ...}, "sets": {name: details},
 "errors": {name: message}} — a set that fails is reported there, the others still count. Exit code 0 when every set
was evaluated, 1 when some failed, 2 when the spec itself is unusable.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from rlctl.evals.scoring import grader, mean_pass_at_k
from rlctl.evals.sets import EvalSet


def read_rows(path: str, input_key: str, label_key: str | None, limit: int | None) -> list[tuple[str, Any]]:
    """(prompt, label) rows of a JSONL/JSON/Parquet file."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(p).to_pylist()
    elif suffix == ".json" and p.read_text().lstrip().startswith("["):
        rows = json.loads(p.read_text())
    else:
        rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    out = [(_prompt(r[input_key]), _label(r, label_key)) for r in rows]
    return out[:limit] if limit else out


def _prompt(v: Any) -> Any:
    """A prompt as the trainer saw it: text, or chat messages ([{"role", "content"}], verl's and the chat datasets'
    layout) that the generator renders with the model's chat template, never their Python repr."""
    if isinstance(v, list) and v and all(isinstance(m, dict) and "content" in m for m in v):
        return [{"role": str(m.get("role") or "user"), "content": str(m["content"])} for m in v]
    return str(v)


def _label(row: dict[str, Any], key: str | None) -> Any:
    """The row's label: a top-level key, or a dotted path into nested columns (verl: reward_model.ground_truth)."""
    if not key:
        return None
    if key in row:
        return row[key]
    v: Any = row
    for part in key.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v


def command_metrics(spec: dict[str, Any], s: EvalSet) -> dict[str, Any]:
    """Run the command template for one set and read its JSON back, named into the set's mode: a key equal to the
    mode (or `primary`) becomes eval/<set>/<mode>; other keys eval/<set>/<mode>/<key>; eval/... keys stay."""
    out = Path(spec["output"]).with_name(f"{Path(spec['output']).stem}.{s.name}.cmd.json")
    values = {"checkpoint": spec["model"], "step": spec["step"], "output": str(out), "set": s.name, "data": s.data,
              "temperature": s.temperature, "n": s.n, "k": s.k, "max_tokens": s.max_tokens, "mode": s.mode,
              "base_model": spec.get("base_model") or "", "run_dir": spec.get("run_dir") or ""}
    argv = [a.format(**values) for a in shlex.split(spec["command"])]
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, timeout=spec.get("timeout_s"))
    if p.returncode != 0:
        raise RuntimeError(f"eval command exited {p.returncode}: {shlex.join(argv)}")
    try:
        raw = json.loads(out.read_text())
    except (OSError, ValueError) as e:
        raise RuntimeError(f"eval command wrote no JSON to {out}: {e}") from None
    raw = raw.get("metrics", raw) if isinstance(raw, dict) else raw
    if not isinstance(raw, dict):
        raise RuntimeError(f"{out}: expected a JSON object of metrics")
    metrics = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if k.startswith("eval/"):
            metrics[k] = float(v)
        elif k in (s.mode, "primary"):
            metrics[s.key] = float(v)
        else:
            metrics[f"{s.key}/{k}"] = float(v)
    return metrics


def rlctl_metrics(spec: dict[str, Any], s: EvalSet, gen: Any) -> tuple[dict[str, float], dict[str, Any]]:
    rows = read_rows(s.data, spec.get("input_key", "input"), spec.get("label_key"), s.limit)
    prompts = [r[0] for r in rows]
    labels = [r[1] for r in rows]
    name, grade = grader(s.grader, any(lab is not None for lab in labels), spec.get("reward_file"),
                         spec.get("reward_name", "reward_func"), s.threshold)
    texts, lengths = gen.generate(prompts, s.n, s.temperature, s.max_tokens)
    counts = []
    flat_ok = 0
    for prompt, label, comps in zip(prompts, labels, texts, strict=True):
        ok = grade([prompt] * len(comps), comps, [label] * len(comps))
        c = sum(bool(x) for x in ok)
        counts.append((len(comps), c))
        flat_ok += c
    total = sum(n for n, _ in counts) or 1
    metrics = {s.key: mean_pass_at_k(counts, s.k), f"{s.key}/mean_correct": flat_ok / total,
               f"{s.key}/response_tokens": sum(sum(x) for x in lengths) / total}
    details = {"grader": name, "prompts": len(prompts), "n": s.n, "k": s.k, "temperature": s.temperature,
               "correct_per_prompt": [c for _, c in counts]}
    if spec.get("keep_samples"):
        details["samples"] = texts
    return metrics, details


def run(spec: dict[str, Any]) -> dict[str, Any]:
    sets = [EvalSet(**d) for d in spec["sets"]]
    result: dict[str, Any] = {"step": spec["step"], "model": spec["model"], "metrics": {}, "sets": {}, "errors": {},
                              "started_at": time.time()}
    gen = None
    if spec.get("evaluator", "rlctl") == "rlctl":
        from rlctl.evals.generate import Generator
        from rlctl.recipe.tiny_model import model_cache, resolve_model

        cache = Path(spec.get("model_cache") or model_cache())  # the launch's cache, not one in the job's cwd
        model = resolve_model(spec["model"], cache)
        base = resolve_model(spec["base_model"], cache) if spec.get("base_model") else None
        gen = Generator(model, base, spec.get("dtype", "float32"), int(spec.get("seed") or 0), spec.get("engine"),
                        spec.get("engine_args") or {})
        result["engine"] = gen.engine
    for s in sets:
        try:
            if gen is None:
                result["metrics"].update(command_metrics(spec, s))
            else:
                metrics, details = rlctl_metrics(spec, s, gen)
                result["metrics"].update(metrics)
                result["sets"][s.name] = details
        except Exception as e:  # one set failing is recorded; the others still count
            result["errors"][s.name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
    result["ended_at"] = time.time()
    return result


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m rlctl.evals.job SPEC.json", file=sys.stderr)
        return 2
    try:
        spec = json.loads(Path(args[0]).read_text())
    except (OSError, ValueError) as e:
        print(f"rlctl eval: cannot read {args[0]}: {e}", file=sys.stderr)
        return 2
    if spec.get("evaluator", "rlctl") == "rlctl":
        from rlctl.core.heavy_imports import imports_frozen
        from rlctl.evals.generate import import_engine

        with imports_frozen():  # seconds of the collector's time saved (rlctl.core.heavy_imports)
            import_engine(spec.get("engine"))
    result = run(spec)
    tmp = Path(spec["output"] + ".tmp")
    tmp.write_text(json.dumps(result, default=str) + "\n")
    os.replace(tmp, spec["output"])
    print(json.dumps(result["metrics"]), flush=True)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    from rlctl.core.heavy_imports import exit_without_final_collection

    exit_without_final_collection(main())
