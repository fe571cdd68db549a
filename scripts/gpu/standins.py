"""The kit's own wheels for packages a GPU machine without network cannot get and a stack imports anyway
(stacks.toml `local`): each is a folder under standins/ made into a pure-Python wheel here.

flash-attn-standin  `flash_attn.bert_padding` and `flash_attn.utils.distributed` in pure torch: what OpenRLHF 0.10.4
                    imports at module load (flash-attn itself is published as source only). Its distribution name is
                    not `flash-attn`, so transformers never takes it for FlashAttention-2 (runs use sdpa).
flash-attn-ring-standin  `flash_attn.flash_attn_interface` with the four names ring-flash-attn 0.1.8 imports at load
                    and no kernels (prime-rl v0.8.0's trainer imports ring-flash-attn whatever its attention; it calls
                    them only with context parallelism). A package of its own: OpenRLHF's guarded import of
                    flash_attn.flash_attn_interface must keep failing.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent / "standins"
# distribution name -> (version, top-level package, one-line summary[, its folder under standins/ if not the package])
STANDINS = {
    "flash-attn-standin": ("0.0.0", "flash_attn",
                           "rlctl GPU kit: flash_attn.bert_padding and flash_attn.utils.distributed in pure torch"),
    "flash-attn-ring-standin": ("0.0.0", "flash_attn",
                                "rlctl GPU kit: the flash_attn.flash_attn_interface names ring-flash-attn imports, "
                                "without kernels", "flash_attn_ring"),
}


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_standin(name: str, dest: Path) -> Path:
    """One stand-in as a wheel in dest (rebuilt every time: it is small and its source is in this checkout)."""
    if name not in STANDINS:
        raise KeyError(f"no stand-in named {name!r}; scripts/gpu/standins.py has: {', '.join(STANDINS)}")
    version, package, summary, *folder = STANDINS[name]
    src = HERE / (folder[0] if folder else package)
    dist = name.replace("-", "_")
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files: list[tuple[str, bytes]] = []
    for f in sorted(src.rglob("*.py")):
        files.append((f"{package}/{f.relative_to(src).as_posix()}", f.read_bytes()))
    files += [
        (f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n"
                             "Requires-Dist: torch\nRequires-Dist: einops\n".encode()),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: rlctl-gpu-kit\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{info}/top_level.txt", f"{package}\n".encode()),
    ]
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            z.writestr(zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0)), d)  # the same bytes every build
        z.writestr(zipfile.ZipInfo(f"{info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)), record)
    return path


def build_standins(names: list[str], dest: Path) -> list[Path]:
    return [build_standin(n, dest) for n in names]
