"""Communication benchmark in the manner of nccl-tests, plus raw loopback TCP as the ceiling.

For each operation and message size: the time of one operation (max over ranks of the mean over
``iters`` runs), the algorithm bandwidth ``algbw = size / time`` and the bus bandwidth, which
nccl-tests defines so that it is comparable across world sizes:

    all_reduce  busbw = algbw * 2 (n - 1) / n
    all_gather  busbw = algbw * (n - 1) / n      (size = the gathered output, n pieces)
    broadcast   busbw = algbw
    p2p         busbw = algbw                    (rank 0 sends to rank 1, one direction)
    tcp         busbw = algbw                    (the same pattern over a plain Python socket)

"tcp" is the ceiling for gloo on one machine: gloo moves bytes over loopback TCP too, so its
p2p can approach but not beat a plain socket between the same two processes. What each rank
times is in ranks.py; this module drives the ranks and reports.

    with ppkit.Cluster(2, "gloo") as cluster:
        rows = run(cluster, sizes=sizes(4 << 10, 1 << 20))
    print(table(rows))
"""

from __future__ import annotations

import statistics

from ppkit.bench.ranks import OPS, measure
from ppkit.errors import ConfigError

MIN_BYTES, MAX_BYTES = 4 << 10, 256 << 20
TARGET_BYTES, TARGET_RATIO = 64 << 20, 0.5  # the goal: gloo p2p at >= 64 MB reaches >= 50% of raw TCP


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' factor from algbw to busbw."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op == "all_gather":
        return (n - 1) / n
    return 1.0


def sizes(min_bytes: int = MIN_BYTES, max_bytes: int = MAX_BYTES, factor: int = 2) -> list[int]:
    """Message sizes from ``min_bytes`` to ``max_bytes``, each ``factor`` times the last."""
    if min_bytes < 4 or max_bytes < min_bytes:
        raise ConfigError(f"need 4 <= min_bytes <= max_bytes, got {min_bytes} and {max_bytes}.")
    if factor < 2:
        raise ConfigError(f"factor must be 2 or more (each size is factor times the last), got {factor}.")
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def parse_size(text: str) -> int:
    """``"4K"`` -> 4096, ``"256M"`` -> 268435456, ``"1G"``, or plain bytes."""
    units = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B") if text.strip() else ""
    number, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        value = int(float(number) * units[unit])
    except ValueError:
        raise ConfigError(f"cannot read the size {text!r}; write it like 4096, 4K, 64M or 1G.") from None
    if value <= 0:
        raise ConfigError(f"a message size must be positive, got {text!r}.")
    return value


def default_iters(size: int) -> tuple[int, int]:
    """(warmup, iters): many runs of small messages, a few of large ones."""
    iters = max(3, min(20, (512 << 20) // size))
    return (1 if size >= (16 << 20) else 3), iters


# -- the controller side ----------------------------------------------------------------------

def run(cluster, ops=OPS, sizes_bytes=None, *, tcp: bool = True, iters: int | None = None,
        warmup: int | None = None, repeats: int = 1, timeout: float = 600, on_row=None) -> list[dict]:
    """Benchmark ``ops`` (and raw TCP) at every size on ``cluster``; one row per (op, size).

    Each (op, size) is measured ``repeats`` times; a row reports the median time (and the fastest
    and slowest in ``time_min_us`` / ``time_max_us``). Sizes go in order and, within a size, the
    operations take turns, so that operations compared with each other (p2p and tcp above all) see
    the same load on a shared machine. ``on_row(row)`` is called as each row is ready.
    """
    sizes_bytes = list(sizes_bytes or sizes())
    ops = list(ops)
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ConfigError(f"unknown benchmark operation(s) {unknown}; choose from {', '.join(OPS)}.")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be a whole number >= 1, got {repeats!r}.")
    if cluster.backend != "gloo" and tcp:
        tcp = False  # a socket is no ceiling for NCCL over NVLink or PCIe
    n = cluster.world_size
    todo = [op for op in ops + (["tcp"] if tcp else []) if n >= 2 or op not in ("p2p", "tcp")]
    rows = []
    for size in sizes_bytes:
        auto_warmup, auto_iters = default_iters(size)
        w = auto_warmup if warmup is None else warmup
        i = auto_iters if iters is None else iters
        times: dict[str, list[float]] = {op: [] for op in todo}
        nbytes: dict[str, int] = {}
        for _ in range(repeats):
            for op in todo:
                results = cluster.run(measure, op, size, w, i, timeout=timeout)
                times[op].append(max(r["seconds"] for r in results))  # the slowest rank's time
                nbytes[op] = results[0]["bytes"]
        for op in todo:
            seconds = statistics.median(times[op])
            algbw = nbytes[op] / seconds / 1e9
            row = {"op": op, "bytes": nbytes[op], "world_size": n, "backend": cluster.backend,
                   "iters": i, "repeats": repeats, "time_us": seconds * 1e6,
                   "time_min_us": min(times[op]) * 1e6, "time_max_us": max(times[op]) * 1e6,
                   "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor(op, n)}
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def format_row(row: dict) -> str:
    return (f"{row['op']:>11} {row['bytes']:>12} {_human(row['bytes']):>8} {row['time_us']:>12.1f} "
            f"{row['algbw_GBps']:>9.3f} {row['busbw_GBps']:>9.3f}")


HEADER = (f"{'op':>11} {'size (B)':>12} {'':>8} {'time (us)':>12} {'algbw':>9} {'busbw':>9}\n"
          f"{'':>11} {'':>12} {'':>8} {'':>12} {'(GB/s)':>9} {'(GB/s)':>9}")


def table(rows) -> str:
    """The rows as nccl-tests-style text, grouped by operation (GB/s = 1e9 bytes/s, as nccl-tests)."""
    order = list(OPS) + ["tcp"]
    ordered = sorted(rows, key=lambda r: (order.index(r["op"]) if r["op"] in order else len(order),
                                          r["bytes"]))
    return "\n".join([HEADER] + [format_row(r) for r in ordered])


def _human(size: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return f"{size}B"


def _spread(row: dict) -> str:
    """The algbw range over the repeats, e.g. "0.9-1.4", or "" for a single measurement."""
    if row.get("repeats", 1) < 2:
        return ""
    low = row["bytes"] / (row["time_max_us"] * 1e-6) / 1e9
    high = row["bytes"] / (row["time_min_us"] * 1e-6) / 1e9
    return f"{low:.2f}-{high:.2f}"


def p2p_vs_tcp(rows, min_bytes: int = TARGET_BYTES) -> list[dict]:
    """For each size >= ``min_bytes`` measured both ways: gloo p2p algbw / raw TCP algbw."""
    tcp = {r["bytes"]: r for r in rows if r["op"] == "tcp"}
    return [{"bytes": r["bytes"], "p2p_GBps": r["algbw_GBps"], "tcp_GBps": tcp[r["bytes"]]["algbw_GBps"],
             "ratio": r["algbw_GBps"] / tcp[r["bytes"]]["algbw_GBps"],
             "p2p_spread": _spread(r), "tcp_spread": _spread(tcp[r["bytes"]])}
            for r in rows if r["op"] == "p2p" and r["bytes"] >= min_bytes and r["bytes"] in tcp]


def summary(rows, min_bytes: int = TARGET_BYTES, target: float = TARGET_RATIO) -> str:
    """One line per large size: how close gloo p2p comes to raw TCP, against the target."""
    compared = p2p_vs_tcp(rows, min_bytes)
    if not compared:
        return (f"no p2p and tcp rows at >= {_human(min_bytes)} to compare; run up to at least "
                f"{_human(min_bytes)} (e.g. ppkit bench -e 256M).")
    lines = []
    for c in compared:
        verdict = "meets" if c["ratio"] >= target else "misses"
        spread = (f" [repeats: p2p {c['p2p_spread']}, tcp {c['tcp_spread']} GB/s]"
                  if c["p2p_spread"] and c["tcp_spread"] else "")
        lines.append(f"p2p at {_human(c['bytes'])}: {c['p2p_GBps']:.2f} GB/s = {c['ratio']:.0%} of raw TCP "
                     f"({c['tcp_GBps']:.2f} GB/s); {verdict} the {target:.0%} target{spread}")
    return "\n".join(lines)


def plot(rows, title: str | None = None):
    """busbw against message size, one line per operation, raw TCP dashed. Returns a Figure."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.2))
    ax = fig.add_subplot()
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        style = {"linestyle": "--", "color": "black"} if op == "tcp" else {"marker": "o"}
        ax.plot([r["bytes"] for r in mine], [r["busbw_GBps"] for r in mine],
                label="raw TCP (ceiling)" if op == "tcp" else op, **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({r["bytes"] for r in rows})
    ax.set_xticks(ticks, [_human(t) for t in ticks], rotation=45, fontsize=8)
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s)")
    if rows:
        ax.set_title(title or f"{rows[0]['backend']}, {rows[0]['world_size']} ranks")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
