"""`bench reconcile --scales`: parsing the list and the table, without running anything."""

from __future__ import annotations

import pytest

from orchestrator.bench.scales import HEADER, parse_scales, table


def test_parse_scales() -> None:
    assert parse_scales("1000,10000, 100_000") == [1000, 10000, 100000]
    for bad in ("", "10,x", "0", "-5", "1.5"):
        with pytest.raises(ValueError, match="--scales"):
            parse_scales(bad)


def test_table_has_a_row_per_scale_and_reports_failures() -> None:
    ok = {
        "pods": 1000, "nodes": 10, "pods_per_second": 300.0, "run_peak_rss_mib": 120.0,
        "baseline_rss_mib": 100.0, "rss_per_pod_kib": 20.48, "cpu_ms_per_pod": 1.9,
        "cpu_ms_per_pod_net": 1.5,
        "http_5xx": 0, "sim_5xx": 0, "lease_renewals": 5, "lease_failures": 0,
        "lease_late": 0, "lease_lost": 0, "nodes_not_ready": 0,
    }  # fmt: skip
    text = table([ok, {"pods": 100000, "nodes": 1000, "error": "exit 1"}], "in process")
    lines = text.splitlines()
    assert lines[0].endswith("in process")
    assert lines[1].count("|") == len(HEADER) + 1
    assert lines[3].startswith(
        "| 1,000 | 10 | 300.0 | 120.0 | 100.0 | 20.48 | 1.900 | 1.500 | 0 / 0 |"
    )
    assert lines[4].startswith("| 100,000 | 1,000 | exit 1 |")
