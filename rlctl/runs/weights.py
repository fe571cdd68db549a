"""Did the weights move? Compare two checkpoints tensor by tensor, reading safetensors files directly (no torch).

A run can log losses, rewards and grad norms while its weights never change (pure bf16 parameters with an lr below
half a bf16 step: docs/precision.md). The only proof is the checkpoints: `compare(a, b)` reads both safetensors
headers, and for each tensor present in both compares its values. Small tensors (LoRA adapters) are compared whole;
a large tensor is compared on `sample` evenly spaced windows of elements, so a 7B full-weight checkpoint costs a few
megabytes of reads. A tensor counts as changed when any compared element differs; `elements_changed` is the fraction
of compared elements that differ. Values are compared as numbers (bf16 and fp32 checkpoints can be compared with each
other), through numpy when it is installed and the standard library otherwise.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors")
DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
              "F8_E4M3": 1, "F8_E5M2": 1}
FLOAT = ("F64", "F32", "F16", "BF16")
WHOLE_ELEMENTS = 1 << 20  # tensors up to 1M elements are compared entirely
WINDOW = 256  # elements per sampled window


@dataclass
class Tensor:
    name: str
    dtype: str
    shape: list[int]
    file: Path
    start: int  # absolute byte offset in the file
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape else 1


@dataclass
class Comparison:
    a: str
    b: str
    tensors: int = 0  # tensors in both
    tensors_changed: int = 0
    elements_compared: int = 0
    elements_changed: int = 0
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    sampled: bool = False
    unchanged_names: list[str] = field(default_factory=list)
    adapter: bool = False  # LoRA adapter tensors: the base is frozen by design, the adapter is what must move

    @property
    def fraction_tensors_changed(self) -> float:
        return self.tensors_changed / self.tensors if self.tensors else 0.0

    @property
    def fraction_elements_changed(self) -> float:
        return self.elements_changed / self.elements_compared if self.elements_compared else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "tensors": self.tensors, "tensors_changed": self.tensors_changed,
                "fraction_tensors_changed": self.fraction_tensors_changed,
                "elements_compared": self.elements_compared, "elements_changed": self.elements_changed,
                "fraction_elements_changed": self.fraction_elements_changed, "sampled": self.sampled,
                "adapter": self.adapter,
                "only_in_a": self.only_in_a[:20], "only_in_b": self.only_in_b[:20],
                "unchanged": self.unchanged_names[:20]}


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory (or the file itself): adapter first, else the model
    (sharded models: every shard)."""
    if path.is_file():
        return [path]
    for name in WEIGHT_FILES:
        if (path / name).is_file():
            return [path / name]
    shards = sorted(path.glob("model-*-of-*.safetensors"))
    if shards:
        return shards
    return sorted(path.glob("*.safetensors")) or sorted(path.rglob("*.safetensors"))[:64]


def read_header(file: Path) -> dict[str, Tensor]:
    with file.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > 100 * 1024 * 1024:
            raise ValueError(f"{file}: not a safetensors file (header of {n} bytes)")
        header = json.loads(fh.read(n))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        out[name] = Tensor(name, info["dtype"], list(info["shape"]), file, base + s, base + e)
    return out


def tensors(path: Path) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for f in weight_files(path):
        out.update(read_header(f))
    return out


def _canonical(name: str) -> str:
    """PEFT names adapters `base_model.model.x.lora_A.weight` in the file and `...lora_A.default.weight` in memory;
    compare by the file's form."""
    return name.replace(".default.", ".")


def _to_float(raw: bytes, dtype: str) -> list[float] | Any:
    try:
        import numpy as np

        if dtype == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            return u.view(np.float32)
        return np.frombuffer(raw, dtype={"F64": "<f8", "F32": "<f4", "F16": "<f2"}[dtype]).astype(np.float32)
    except ImportError:
        if dtype == "BF16":
            n = len(raw) // 2
            return [struct.unpack("<f", b"\0\0" + raw[2 * i:2 * i + 2])[0] for i in range(n)]
        fmt = {"F64": "d", "F32": "f", "F16": "e"}[dtype]
        return list(struct.unpack(f"<{len(raw) // DTYPE_SIZE[dtype]}{fmt}", raw))


def _count_diff(x: Any, y: Any) -> int:
    try:
        import numpy as np

        return int(np.count_nonzero(np.asarray(x) != np.asarray(y)))
    except ImportError:
        return sum(1 for u, v in zip(x, y, strict=True) if u != v)


def _windows(numel: int, sample: int) -> list[tuple[int, int]]:
    """Element ranges to compare: everything for small tensors, else `sample` windows spread evenly."""
    if numel <= WHOLE_ELEMENTS or sample <= 0:
        return [(0, numel)]
    n = min(sample, max(numel // WINDOW, 1))
    stride = numel // n
    return [(i * stride, min(i * stride + WINDOW, numel)) for i in range(n)]


class _Reader:
    def __init__(self) -> None:
        self.maps: dict[Path, tuple[Any, Any]] = {}

    def read(self, t: Tensor, lo: int, hi: int) -> bytes:
        if t.file not in self.maps:
            fh = t.file.open("rb")
            self.maps[t.file] = (fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
        size = DTYPE_SIZE[t.dtype]
        return self.maps[t.file][1][t.start + lo * size:t.start + hi * size]

    def close(self) -> None:
        for fh, mm in self.maps.values():
            mm.close()
            fh.close()


def compare(a: Path, b: Path, sample: int = 64) -> Comparison:
    """Fraction of tensors (and of compared elements) that differ between checkpoints a and b."""
    ta = {_canonical(k): v for k, v in tensors(a).items()}
    tb = {_canonical(k): v for k, v in tensors(b).items()}
    if not ta or not tb:
        raise FileNotFoundError(f"no safetensors weights in {a if not ta else b}")
    c = Comparison(str(a), str(b))
    c.only_in_a = sorted(set(ta) - set(tb))
    c.only_in_b = sorted(set(tb) - set(ta))
    c.adapter = any(_is_adapter(n) for n in set(ta) & set(tb))
    reader_a, reader_b = _Reader(), _Reader()
    try:
        for name in sorted(set(ta) & set(tb)):
            x, y = ta[name], tb[name]
            if x.dtype not in FLOAT or y.dtype not in FLOAT or x.numel != y.numel:
                continue
            c.tensors += 1
            changed = 0
            wins = _windows(x.numel, sample)
            c.sampled = c.sampled or len(wins) > 1 or wins[0] != (0, x.numel)
            for lo, hi in wins:
                xa = _to_float(reader_a.read(x, lo, hi), x.dtype)
                yb = _to_float(reader_b.read(y, lo, hi), y.dtype)
                changed += _count_diff(xa, yb)
                c.elements_compared += hi - lo
            c.elements_changed += changed
            if changed:
                c.tensors_changed += 1
            else:
                c.unchanged_names.append(name)
    finally:
        reader_a.close()
        reader_b.close()
    return c


def _is_adapter(name: str) -> bool:
    """A PEFT LoRA tensor (lora_A, lora_B, lora_embedding_A/B, lora_magnitude_vector of DoRA)."""
    return ".lora_" in name


def verdict(c: Comparison) -> tuple[str, str]:
    """(severity ok|warn|critical, one line) for doctor. A LoRA adapter is judged by its tensors: each must move (the
    base weights are frozen by design and are not in the adapter file)."""
    what = "adapter tensors" if c.adapter else "tensors"
    line = (f"{c.tensors_changed}/{c.tensors} {what} changed ({c.fraction_tensors_changed:.1%}), "
            f"{c.fraction_elements_changed:.2%} of {c.elements_compared:,} compared values"
            + (" (sampled)" if c.sampled else "") + f" between {Path(c.a).name} and {Path(c.b).name}")
    if not c.tensors:
        return "warn", (f"no tensor in common between {Path(c.a).name} and {Path(c.b).name} "
                        f"({len(c.only_in_a)} vs {len(c.only_in_b)} names): nothing compared")
    if c.adapter:
        if c.tensors_changed == 0:
            return "critical", line + ": the LoRA adapter did not change at all (only the adapter trains)"
        if c.tensors_changed < c.tensors:
            return "warn", line + f": some adapter tensors did not move ({', '.join(c.unchanged_names[:3])}" + (
                ", ..." if len(c.unchanged_names) > 3 else "") + ")"
        return "ok", line + ": the LoRA adapter moves (the base weights stay frozen by design)"
    if c.tensors_changed == 0:
        return "critical", line + ": the weights did not change at all"
    if c.fraction_elements_changed < 0.1:
        return "critical", line + ": almost no weight moved"
    if c.fraction_elements_changed < 0.5:
        return "warn", line + ": most weights did not move"
    return "ok", line


def start_weights(run_dir: Path) -> Path | None:
    """The weights the run started from: model.path when it is a local directory, or the tiny model a `random:`
    source was made into (in the model cache the launch recorded)."""
    import json
    import tomllib

    try:
        model = tomllib.loads((run_dir / "recipe.toml").read_text())["model"]["path"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(model, str):
        return None
    path = Path(model)
    if model.startswith("random:"):

        from rlctl.recipe.tiny_model import cache_key

        try:
            cache = json.loads((run_dir / ".launch.json").read_text())["env_extra"]["RLCTL_MODEL_CACHE"]
        except (OSError, ValueError, KeyError, TypeError):  # no launch record: the cache launch uses by default
            from rlctl.recipe.tiny_model import model_cache

            cache = str(model_cache())
        try:
            path = Path(cache) / cache_key(model)
        except Exception:  # a source that no longer parses
            return None
    return path if path.is_dir() and _has_weights(path) else None


def _has_weights(path: Path) -> bool:
    return any((path / n).is_file() for n in WEIGHT_FILES) or any(path.glob("model-*-of-*.safetensors"))


def weight_sets(run_dir: Path) -> tuple[list[Path], list[Path]]:
    """(complete stepped checkpoints with weights, oldest first; folders of weights without a step in the checkpoint
    directory, such as a `final/` or a `step_final/`, oldest first)."""
    from rlctl.runs.checkpoints import final_saves, find_checkpoints
    from rlctl.runs.state import read_state

    backend = read_state(run_dir).get("backend") or ""
    stepped = [c.path for c in find_checkpoints(backend, run_dir) if c.complete and weight_files(c.path)]
    return stepped, final_saves(backend, run_dir)


def run_pair(run_dir: Path) -> tuple[Path, Path] | None:
    """The two weight sets of a run to compare: its oldest and newest complete checkpoints (a final save without a
    step counts as the newest); with one checkpoint, the weights it started from (model.path, or the tiny model of a
    `random:` source) and that checkpoint."""
    stepped, unstepped = weight_sets(run_dir)
    every = stepped + unstepped
    if not every:
        return None
    newest = every[-1]
    start = start_weights(run_dir)
    adapter = (newest / "adapter_model.safetensors").is_file()  # an adapter has no "before"
    if len(stepped) >= 2:
        return stepped[0], newest
    if start is not None and not adapter:
        return start, newest
    if len(every) >= 2:
        return every[0], newest
    return None


def nothing_to_compare(run_dir: Path) -> str:
    """What `doctor --weights` says of a run without two weight sets to compare: a fact, not a finding (nothing is
    known about whether its weights move)."""
    from rlctl.runs.checkpoints import checkpoint_dir
    from rlctl.runs.state import read_state

    st = read_state(run_dir)
    host = ((st.get("handle") or {}).get("ref") or {}).get("host") if st.get("executor") == "ssh" else None
    stepped, unstepped = weight_sets(run_dir)
    if host and not stepped + unstepped:  # its checkpoints live where it trained
        return (f"{run_dir.name}: its checkpoints are on {host}, not on this machine: `rlctl ckpt pull "
                f"{run_dir.name}` brings the newest here (twice, with --step, for two to compare), or run "
                f"`rlctl doctor RUN --weights` on {host}")
    found = [p.name for p in stepped + unstepped]
    what = (f"only {found[0]} has safetensors weights" if found else
            f"no checkpoint with weights (safetensors) in {checkpoint_dir(run_dir)}")
    return (f"{run_dir.name}: nothing to compare the weights with: {what}, and the weights the run started from are "
            "not on this machine. Keep at least two checkpoints (checkpoint.every), or compare with the base model: "
            f"rlctl doctor {run_dir.name} --between MODEL_DIR --between CHECKPOINT")


def between_paths(run_dir: Path, given: list[str]) -> tuple[Path, Path]:
    """`doctor --between A --between B`: each a checkpoint directory or .safetensors file, or a step number that is
    no such path (the run's checkpoint at that step, as `rlctl ckpt list` shows it)."""
    from rlctl.errors import RlctlError
    from rlctl.runs.checkpoints import find_checkpoints
    from rlctl.runs.state import read_state

    if len(given) != 2:
        raise RlctlError(f"--between takes two checkpoints, got {len(given)}.",
                         hint="--between A --between B (checkpoint directories, .safetensors files or step numbers)")
    ckpts = {c.step: c.path for c in find_checkpoints(str(read_state(run_dir).get("backend") or ""), run_dir)
             if c.complete and c.step is not None}
    out = []
    for g in given:
        if Path(g).exists() or not g.isdigit():
            out.append(Path(g))
        elif int(g) in ckpts:
            out.append(ckpts[int(g)])
        else:
            have = ", ".join(str(s) for s in sorted(ckpts)) or "none"
            raise RlctlError(f"--between {g}: {run_dir.name} has no complete checkpoint at step {g} (its steps: "
                             f"{have}).", hint="give a step it has, or checkpoint directories: " + "; ".join(
                                 f"{s}: {ckpts[s]}" for s in sorted(ckpts)) if ckpts else
                             "give two checkpoint directories or .safetensors files")
    return out[0], out[1]


def weights_finding(run_dir: Path, sample: int = 64, pair: tuple[Path, Path] | None = None) -> Any:
    """A doctor Finding on whether the run's weights move; None when there is nothing to compare
    (nothing_to_compare says why)."""
    from rlctl.runs.doctor import Finding

    given = pair is not None
    pair = pair or run_pair(run_dir)
    if pair is None:
        return None
    c = compare(pair[0], pair[1], sample)
    severity, line = verdict(c)
    if not given and c.tensors and c.tensors_changed == 0 and pair[1] in weight_sets(run_dir)[1]:
        # a save without a step (final/) right after the last checkpoint holds the same weights: not a frozen run
        return Finding("weights_frozen", "warn", line + f": {pair[1].name} has no step and is probably the same "
                       f"step as {pair[0].name}", "compare two checkpoints of different steps: --between A --between B",
                       c.to_json())
    if severity == "ok":
        return Finding("weights_frozen", "ok", line, "none: the weights move", c.to_json())
    if c.adapter:
        return Finding("weights_frozen", severity, line,
                       "check that lora.target_modules name modules of this model and that optim.lr is not 0; with "
                       "pure bf16 adapter weights an update below half a bf16 step is rounded away: model.precision = "
                       "\"mixed\"", c.to_json())
    return Finding("weights_frozen", severity, line,
                   "with pure bf16 parameters an update below half a bf16 step is rounded away: set "
                   "model.precision = \"mixed\" (fp32 master weights), or raise optim.lr; check that the "
                   "trainable parameters are the ones you meant (LoRA target_modules)", c.to_json())


def settle(findings: list[Any], proof: Any) -> list[Any]:
    """The findings with the checkpoints' proof in place of the metrics' guess: `frozen_weights` reads signs in the
    metrics (lr 0, no gradient, a KL of 0), the comparison of the weights says whether they moved. Both at once
    contradicted each other (on a LoRA run the KL to the base can read 0 while the adapter moves), so the proof stays
    and carries the sign as evidence: one message."""
    guesses = [f for f in findings if f.rule == "frozen_weights"]
    if guesses:
        sign = guesses[0].message
        proof.message += (f" (the metrics' sign, {sign}, is not frozen weights)" if proof.severity == "ok"
                          else f"; the metrics agree: {sign}")
        proof.evidence = {**proof.evidence, "metrics_sign": sign}
    return [f for f in findings if f.rule != "frozen_weights"] + [proof]
