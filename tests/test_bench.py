"""The communication benchmark: nccl-tests formulas, size parsing, a small real run, the CLI."""

from __future__ import annotations

import json

import pytest

from ppkit.bench import comm
from ppkit.cli import main as cli_main
from ppkit.errors import ConfigError


def test_bus_factors_are_nccl_tests():
    assert comm.bus_factor("all_reduce", 4) == pytest.approx(1.5)   # 2(n-1)/n
    assert comm.bus_factor("all_gather", 4) == pytest.approx(0.75)  # (n-1)/n
    assert comm.bus_factor("broadcast", 4) == 1.0
    assert comm.bus_factor("p2p", 2) == 1.0 and comm.bus_factor("tcp", 2) == 1.0


def test_default_sizes_run_from_4k_to_256m():
    s = comm.sizes()
    assert s[0] == 4096 and s[-1] == 256 << 20 and len(s) == 17
    assert comm.sizes(4096, 65536, 4) == [4096, 16384, 65536]


@pytest.mark.parametrize("text, value", [("4K", 4096), ("256M", 256 << 20), ("1G", 1 << 30),
                                         ("4096", 4096), ("64MB", 64 << 20), ("4KiB", 4096), ("0.5K", 512)])
def test_parse_size(text, value):
    assert comm.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-4K", "4X"])
def test_parse_size_rejects(text):
    with pytest.raises(ConfigError):
        comm.parse_size(text)


def test_bad_ranges_are_refused():
    with pytest.raises(ConfigError, match="min_bytes <= max_bytes"):
        comm.sizes(1 << 20, 4096)
    with pytest.raises(ConfigError, match="factor must be 2 or more"):
        comm.sizes(4096, 8192, 1)


@pytest.mark.slow
def test_small_run_reports_time_algbw_busbw_and_tcp(cluster2):
    if cluster2.state == "broken":
        cluster2.restart()
    seen = []
    rows = comm.run(cluster2, sizes_bytes=[4096, 65536], iters=3, warmup=1, repeats=3, on_row=seen.append)
    assert seen == rows
    assert [(r["op"], r["bytes"]) for r in rows] == [  # size by size, so p2p and tcp see the same load
        (op, size) for size in (4096, 65536) for op in ("p2p", "all_reduce", "all_gather", "broadcast", "tcp")]
    for r in rows:
        assert 0 < r["time_min_us"] <= r["time_us"] <= r["time_max_us"] and r["repeats"] == 3
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * comm.bus_factor(r["op"], 2))
    text = comm.table(rows).splitlines()
    assert "busbw" in text[0] and text[2].split()[:2] == ["p2p", "4096"] and text[3].split()[:2] == ["p2p", "65536"]
    fig = comm.plot(rows)
    assert {line.get_label() for line in fig.axes[0].lines} >= {"p2p", "raw TCP (ceiling)"}


def test_all_gather_size_is_the_gathered_output(cluster4):
    if cluster4.state == "broken":
        cluster4.restart()
    (row,) = comm.run(cluster4, ["all_gather"], [4096 * 3], tcp=False, iters=2, warmup=0)
    assert row["bytes"] == 12288 and row["world_size"] == 4  # 768 floats per rank, 4 ranks
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 0.75)


def test_unknown_op_and_bad_repeats_are_refused(cluster2):
    with pytest.raises(ConfigError, match="unknown benchmark operation"):
        comm.run(cluster2, ["all_to_all"], [4096])
    with pytest.raises(ConfigError, match="repeats must be a whole number >= 1"):
        comm.run(cluster2, ["p2p"], [4096], repeats=0)


def test_summary_compares_p2p_with_tcp():
    rows = [{"op": "p2p", "bytes": 64 << 20, "algbw_GBps": 0.6}, {"op": "tcp", "bytes": 64 << 20, "algbw_GBps": 1.0},
            {"op": "p2p", "bytes": 256 << 20, "algbw_GBps": 0.4}, {"op": "tcp", "bytes": 256 << 20, "algbw_GBps": 1.0},
            {"op": "p2p", "bytes": 4096, "algbw_GBps": 0.001}, {"op": "tcp", "bytes": 4096, "algbw_GBps": 0.5}]
    assert [c["ratio"] for c in comm.p2p_vs_tcp(rows)] == pytest.approx([0.6, 0.4])
    assert comm.summary(rows).splitlines() == [
        "p2p at 64M: 0.60 GB/s = 60% of raw TCP (1.00 GB/s); meets the 50% target",
        "p2p at 256M: 0.40 GB/s = 40% of raw TCP (1.00 GB/s); misses the 50% target"]
    assert comm.summary(rows[4:]).startswith("no p2p and tcp rows at >= 64M")
    spread = [dict(r, repeats=3, time_us=1e6 * r["bytes"] / r["algbw_GBps"] / 1e9,
                   time_min_us=1e6 * r["bytes"] / (2 * r["algbw_GBps"]) / 1e9,
                   time_max_us=1e6 * r["bytes"] / (r["algbw_GBps"] / 2) / 1e9) for r in rows[:2]]
    assert comm.summary(spread) == ("p2p at 64M: 0.60 GB/s = 60% of raw TCP (1.00 GB/s); meets the 50% target "
                                    "[repeats: p2p 0.30-1.20, tcp 0.50-2.00 GB/s]")


@pytest.mark.slow
def test_cli_prints_table_and_writes_json(tmp_path, capsys):
    out_file = tmp_path / "rows.json"
    code = cli_main(["bench", "-b", "4K", "-e", "16K", "-f", "4", "--ops", "p2p,all_reduce",
                     "--iters", "2", "-r", "1", "--json", str(out_file)])
    assert code == 0
    out = capsys.readouterr().out
    assert "# backend in use: gloo" in out and "all_reduce" in out and "tcp" in out
    assert "no p2p and tcp rows at >= 64M" in out  # too small to judge the target, and it says so
    rows = json.loads(out_file.read_text())
    assert [(r["op"], r["bytes"]) for r in rows] == [
        ("p2p", 4096), ("all_reduce", 4096), ("tcp", 4096), ("p2p", 16384), ("all_reduce", 16384), ("tcp", 16384)]


@pytest.mark.parametrize("argv, words", [
    (["--ops", "p2p,all_to_all"], "unknown operation(s) ['all_to_all']"),
    (["-b", "huge"], "cannot read the size 'huge'"),
    (["--iters", "0"], "--iters must be at least 1"),
    (["--repeats", "0"], "--repeats must be at least 1"),
])
def test_cli_rejects_bad_arguments(capsys, argv, words):
    assert cli_main(["bench", *argv]) == 2
    assert words in capsys.readouterr().err


def test_cli_default_ops_are_the_benchmarks_ops():
    from ppkit.cli import bench as bench_cli

    assert bench_cli.OPS_DEFAULT.split(",") == list(comm.OPS)
