"""rlctl/core/gpus.py: the one place that asks this machine for its GPUs, read through every caller.

No GPU here: `nvidia-smi` is a script on PATH printing what the real one prints for
`--query-gpu=index,name,memory.total,memory.used,memory.free,driver_version --format=csv,noheader,nounits`
on a two-H100 machine (one board reporting [N/A], as some do), and NVML fails as it does without a driver.
"""

from __future__ import annotations

import os
import stat
import sys

import pytest

SMI_OUT = """0, NVIDIA H100 80GB HBM3, 81559, 1024, 80535, 570.124.06
1, NVIDIA H100 80GB HBM3, [N/A], [N/A], [N/A], 570.124.06
"""


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\ncat <<'X'\n{SMI_OUT}X\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # NVML absent: every caller falls back to nvidia-smi
    return exe


def test_smi_rows_and_callers(fake_smi):
    from rlctl.core.gpus import list_gpus, smi_rows
    from rlctl.experiments.queue import local_gpu_free_gib
    from rlctl.facts import gpus as fact_gpus
    from rlctl.runs.rundir import gpus as env_gpus
    from rlctl.runs.status import gpu_stats

    rows = smi_rows()
    assert rows is not None and [r["index"] for r in rows] == [0, 1]
    assert rows[0]["memory_free_gib"] == pytest.approx(80535 / 1024) and rows[1]["memory_free_gib"] is None
    assert list_gpus() == (rows, None)
    assert local_gpu_free_gib() == {0: pytest.approx(80535 / 1024)}  # a board without figures gets no run
    facts, note = fact_gpus()
    assert note is None and facts[0] == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_gib": 79.6,
                                         "memory_used_gib": 1.0}
    assert facts[1]["memory_total_gib"] is None
    assert env_gpus()[0] == {"index": "0", "name": "NVIDIA H100 80GB HBM3", "memory": "81559 MiB",
                             "driver": "570.124.06"}
    assert gpu_stats() is None  # live utilisation needs NVML; status says nothing rather than guess


def test_no_gpu_says_why(tmp_path, monkeypatch):
    from rlctl.core.gpus import list_gpus
    from rlctl.experiments.queue import local_gpu_free_gib

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    rows, why = list_gpus()
    assert rows is None and "no NVIDIA GPU found" in why and "nvidia-smi not installed" in why
    assert local_gpu_free_gib() is None
