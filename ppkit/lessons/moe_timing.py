"""Lesson 12, measured: where the tokens went, what was dropped, the bytes sent and the time of one step.

    m = measure(cluster, experts=8, ranks=4, top_k=2, capacity_factor=1.25, skew=0.0)
    m.kept_per_expert     (token, choice) pairs each expert computed, over every rank's tokens
    m.rows_per_rank       rows each rank's experts computed (its share of the work)
    m.dropped_pairs, m.dropped_tokens   pairs over capacity; tokens none of whose choices was kept
    m.sent_bytes          bytes handed to the dispatch and combine all_to_alls, forward and backward
    m.counted_bytes       kept pairs x hidden x element size x 4: what they must equal
    m.step_s              the slowest rank's forward + backward, wall time
    m.phases              seconds per phase per rank (route, counts, dispatch, experts, combine, ...)
    plot(m)               tokens per expert, rows per rank, time per phase per rank

Every rank computes with one thread (a core per rank, as a GPU per rank would be), on ranks 0..ranks-1 of
the cluster. Settings are checked in the kernel before anything runs, so a refused one leaves the cluster
as it was.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ppkit.errors import ConfigError
from ppkit.lessons import timeline
from ppkit.lessons.context_parallel import ring_group
from ppkit.lessons.expert_parallel import AllToAllLog, ep_moe_layer
from ppkit.lessons.moe import MoESettings, parameters, settings, tokens, whole_number

FORWARD = ("route", "counts", "dispatch", "experts", "combine", "gather")
PHASES = (*FORWARD, "backward compute", "combine grad", "dispatch grad")
COMM = {"counts", "dispatch", "combine", "combine grad", "dispatch grad"}
COLORS = {"route": "#b5d9a8", "counts": "#f3c99b", "dispatch": "#e59866", "experts": "#4f9a5a", "combine": "#d35f3f",
          "gather": "#8fbc8f", "backward compute": "#2e6b3a", "combine grad": "#b03a2e", "dispatch grad": "#e8a87c"}


def _phases(spans, backward_s: float) -> dict:
    seconds = dict.fromkeys(PHASES, 0.0)
    for span in spans:
        seconds[span["label"]] += span["end"] - span["start"]
    seconds["backward compute"] = max(backward_s - seconds["combine grad"] - seconds["dispatch grad"], 0.0)
    return seconds


def _measure_job(rank, world_size, k, options, repeats):
    group = ring_group(k)
    if rank >= k:
        return None
    s = settings(**options)
    p = parameters(s).local(rank, k, s).trainable()
    x, upstream = tokens(s, rank)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runs = []
    try:
        for _ in range(repeats + 1):  # the first warms up allocations and connections
            log, tl, mine = AllToAllLog(), timeline.Timeline(rank), x.clone().requires_grad_()
            dist.barrier(group)
            start = time.monotonic()
            y, r = ep_moe_layer(mine, p, s, group, log, tl)
            middle = time.monotonic()
            ((y * upstream).sum() + 0.01 * r.aux_loss).backward()
            end = time.monotonic()
            runs.append({"step_s": end - start, "phases": _phases(tl.spans, end - middle)})
    finally:
        torch.set_num_threads(threads)
    computed = next(c["rows"] for c in log.calls if c["what"] == "combine" and c["direction"] == "forward")
    return {"runs": runs[1:], "chosen": r.chosen_per_expert().tolist(), "kept": r.kept_per_expert().tolist(),
            "dropped_pairs": r.dropped_pairs, "dropped_tokens": r.dropped_tokens, "rows": computed,
            "aux_loss": float(r.aux_loss.detach()), "bytes": log.total(), "off_rank": log.total("off_rank"),
            "count_bytes": log.total(what=("counts",))}


@dataclass
class Measurement:
    """One measured forward + backward of the expert-parallel layer; per-rank lists are indexed by rank.
    ``phases`` and ``steps`` come from the repeat whose slowest rank was fastest."""

    settings: MoESettings
    ranks: int
    chosen: list          # per rank: pairs that picked each expert (before capacity)
    kept: list            # per rank: pairs each expert kept
    rows: list            # per rank: rows its experts computed
    dropped: list         # per rank: (pairs, tokens) dropped
    aux_loss: list        # per rank: the load-balancing loss of its tokens
    sent: list            # per rank: (bytes to the dispatch/combine all_to_alls, of them to other ranks)
    count_bytes: list     # per rank: bytes of the count exchange
    phases: list          # per rank: seconds per phase
    steps: list           # per rank: wall seconds of forward + backward

    @property
    def chosen_per_expert(self) -> list[int]:
        return [sum(col) for col in zip(*self.chosen)]

    @property
    def kept_per_expert(self) -> list[int]:
        return [sum(col) for col in zip(*self.kept)]

    @property
    def rows_per_rank(self) -> list[int]:
        return list(self.rows)

    @property
    def dropped_pairs(self) -> int:
        return sum(d[0] for d in self.dropped)

    @property
    def dropped_tokens(self) -> int:
        return sum(d[1] for d in self.dropped)

    @property
    def sent_bytes(self) -> int:
        return sum(b for b, _ in self.sent)

    @property
    def off_rank_bytes(self) -> int:
        return sum(o for _, o in self.sent)

    @property
    def row_bytes(self) -> int:
        return self.settings.hidden * torch.empty(0, dtype=getattr(torch, self.settings.dtype)).element_size()

    @property
    def counted_bytes(self) -> int:
        """Kept pairs x hidden x element size, for dispatch and combine, forward and backward."""
        return sum(self.kept_per_expert) * self.row_bytes * 4

    @property
    def padded_bytes(self) -> int:
        """What a dispatch of fixed-size buffers (every expert's full capacity, from every rank) would send."""
        return self.ranks * self.settings.experts * self.settings.capacity() * self.row_bytes * 4

    @property
    def step_s(self) -> float:
        return max(self.steps)

    @property
    def imbalance(self) -> float:
        """Rows of the busiest rank over the mean: what the slowest rank's experts do more than the rest."""
        mean = statistics.mean(self.rows)
        return max(self.rows) / mean if mean else 1.0

    def title(self) -> str:
        s = self.settings
        return (f"{s.experts} experts over {self.ranks} ranks, top-{s.top_k}, capacity factor "
                f"{s.capacity_factor:g}, skew {s.skew:g}, {s.tokens} tokens per rank")

    def summary(self) -> str:
        s = self.settings
        total = self.ranks * s.tokens * s.top_k
        return (f"{self.title()}: dropped {self.dropped_pairs} of {total} (token, choice) pairs "
                f"({self.dropped_tokens} tokens got no expert); busiest rank / mean = {self.imbalance:.2f}; "
                f"all_to_all {self.sent_bytes:,} bytes (counted {self.counted_bytes:,}); "
                f"step {self.step_s * 1e3:.0f} ms")


def check_settings(cluster_world_size: int, ranks=None, **options) -> tuple[MoESettings, int]:
    """The settings and the number of ranks, or a ConfigError saying which value is impossible and what works."""
    ranks = cluster_world_size if ranks is None else ranks
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= cluster_world_size:
        raise ConfigError(f"ranks={ranks!r}: the cluster has {cluster_world_size} ranks, so the experts can be "
                          f"spread over 1 to {cluster_world_size} of them; pick one of those (or start a larger "
                          "cluster).")
    s = settings(**options)
    s.experts_per_rank(ranks)
    return s, ranks


def measure(cluster, experts: int = 8, ranks: int | None = None, top_k: int = 2, capacity_factor: float = 1.25,
            skew: float = 0.0, tokens: int = 1024, hidden: int = 128, ffn: int = 512, repeats: int = 1,
            timeout: float = 120) -> Measurement:
    """Run the expert-parallel layer forward and backward on ranks 0..ranks-1 of ``cluster`` and measure it."""
    options = {"experts": experts, "top_k": top_k, "capacity_factor": capacity_factor, "skew": skew,
               "tokens": tokens, "hidden": hidden, "ffn": ffn}
    s, ranks = check_settings(cluster.world_size, ranks, **options)
    whole_number("repeats", repeats)
    results = cluster.run(_measure_job, ranks, options, repeats, timeout=timeout)[:ranks]
    best = min(range(repeats), key=lambda i: max(r["runs"][i]["step_s"] for r in results))
    return Measurement(s, ranks, [r["chosen"] for r in results], [r["kept"] for r in results],
                       [r["rows"] for r in results], [(r["dropped_pairs"], r["dropped_tokens"]) for r in results],
                       [r["aux_loss"] for r in results], [(r["bytes"], r["off_rank"]) for r in results],
                       [r["count_bytes"] for r in results], [r["runs"][best]["phases"] for r in results],
                       [r["runs"][best]["step_s"] for r in results])


# -- pictures -----------------------------------------------------------------------------------

def plot(m: Measurement):
    """Three panels: pairs per expert (kept, coloured by the rank that holds the expert, and dropped),
    rows each rank's experts computed, and each rank's step time by phase (communication hatched)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 3.6))
    per_expert, per_rank, times = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.4, 1, 1.4]})
    n = m.settings.experts_per_rank(m.ranks)
    kept, chosen = m.kept_per_expert, m.chosen_per_expert
    experts = range(m.settings.experts)
    per_expert.bar(experts, kept, color=[f"C{e // n % 10}" for e in experts])
    if m.dropped_pairs:
        per_expert.bar(experts, [c - k for c, k in zip(chosen, kept)], bottom=kept, color="white",
                       edgecolor="#b00020", hatch="//", label=f"dropped ({m.dropped_pairs})")
    per_expert.axhline(m.ranks * m.settings.capacity(), color="black", linestyle=":", linewidth=1,
                       label="capacity x ranks")
    per_expert.set_title("(token, choice) pairs per expert", fontsize=9)
    per_expert.set(xlabel="expert (colour: the rank holding it)", ylabel="pairs")
    per_expert.legend(fontsize=8)
    per_rank.bar(range(m.ranks), m.rows, color=[f"C{r % 10}" for r in range(m.ranks)])
    per_rank.axhline(statistics.mean(m.rows), color="black", linestyle=":", linewidth=1, label="mean")
    per_rank.set_title(f"rows computed per rank (busiest / mean {m.imbalance:.2f})", fontsize=9)
    per_rank.set(ylabel="rows")
    per_rank.set_xticks(range(m.ranks), [f"rank {r}" for r in range(m.ranks)])
    per_rank.legend(fontsize=8)
    left = [0.0] * m.ranks
    for phase in PHASES:
        widths = [ph[phase] * 1e3 for ph in m.phases]
        times.barh(range(m.ranks), widths, left=left, color=COLORS[phase], hatch="//" if phase in COMM else None,
                   label=phase, edgecolor="black", linewidth=0.3)
        left = [a + b for a, b in zip(left, widths)]
    times.set_yticks(range(m.ranks), [f"rank {r}" for r in range(m.ranks)])
    times.invert_yaxis()
    times.set_title(f"time per rank: step {m.step_s * 1e3:.0f} ms (forward + backward)", fontsize=9)
    times.set(xlabel="ms (hatched: all_to_all, waits included)")
    times.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig
