"""A local Ray head gets distinct ports for every component (two equal picks made `ray start` refuse to start)."""

from __future__ import annotations

from rlctl.executors.ray import LocalHead, free_ports


def test_free_ports_are_distinct():
    for _ in range(100):
        ports = free_ports(7)
        assert len(set(ports)) == 7


def test_local_head_ports_are_distinct(tmp_path):
    head = LocalHead(tmp_path)
    try:
        ports = [head.port, head.dashboard_port, *head.component_ports]
        assert len(ports) == 7 and len(set(ports)) == 7
    finally:
        head.temp_dir.rmdir()
