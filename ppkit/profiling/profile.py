"""``ppkit.Profile``: what a profiled run returns, every rank's trace on one clock.

    prof = ppkit.spawn(train, args=(2,), nprocs=2, profile=True)
    prof                    # the timeline: a row per rank and thread, hover for each op
    prof.summary()          # per rank: compute, communication, overlapped, idle, top ops
    prof.save("step.json")  # one trace for ui.perfetto.dev or chrome://tracing, and each rank's beside it
"""

from __future__ import annotations

import json
import os
import re

from ppkit.errors import ConfigError
from ppkit.profiling import clocks, collect, merge
from ppkit.profiling.classify import COMMUNICATION, COMPUTE
from ppkit.profiling.clocks import Offset
from ppkit.profiling.events import RankEvents
from ppkit.profiling.summary import Summary


class Profile:
    """Every rank's ``torch.profiler`` recording of one run, merged on the kernel's clock.

    ``ranks[r]``: rank r's own profiler events (torch's EventList, rebuilt from its trace:
    ``prof.ranks[0].key_averages().table()``; ``prof.ranks[0].export_chrome_trace(path)`` writes its trace).
    ``trace(r)``: rank r's own trace as its profiler wrote it, with its rank and world size.
    ``missing[r]``: why rank r's trace is not here (it raised, it was stopped after another rank failed); a
    run that failed keeps what the ranks that recorded sent.
    ``offsets[r]``: rank r's clock against the kernel's and its error bound (clocks.py).
    ``applied_offsets[r]``: the offsets taken off rank r's times: one per machine other than the kernel's
    (its ranks' intervals intersected, clocks.shared), where it exceeds its bound (a smaller one is noise,
    and the ranks' times stay as recorded). ``here``: the kernel's clock (collect.clock_id; a rank's
    result names its own as ``clock``, or else ``host``).
    """

    def __init__(self, results: dict[int, dict] | None = None, offsets: dict[int, Offset] | None = None,
                 here: str | None = None, world_size: int | None = None, missing: dict[int, str] | None = None):
        self._load(results or {}, offsets, here, world_size, missing)

    def _load(self, results: dict[int, dict], offsets: dict[int, Offset] | None, here: str | None = None,
              world_size: int | None = None, missing: dict[int, str] | None = None) -> None:
        """Take the ranks' recordings (``cluster.profile()`` fills its Profile when its block ends);
        ``world_size``: how many ranks ran (some may have sent no trace), None where unknown; ``missing``:
        rank -> why it sent no trace (a rank raised, the run was stopped)."""
        self.missing = dict(sorted((missing or {}).items()))
        self.offsets = dict(offsets or {})
        results = {rank: _parsed(result) for rank, result in results.items()}
        here = collect.clock_id() if here is None else here
        self.applied_offsets = _applied(results, self.offsets, here)
        self._merged = merge.merge(results, self.applied_offsets)
        self._traces = {rank: _with_rank(result["trace"], rank, world_size) for rank, result in results.items()}
        self.ranks = RankEvents(self._traces)
        self.hosts = dict(self._merged.hosts)

    @classmethod
    def from_results(cls, values: list, offsets: dict[int, Offset] | None = None,
                     missing: dict[int, str] | None = None) -> Profile:
        """From a job's values by rank (collect.trace_of's dicts); a rank that sent none is left out, and
        ``missing`` says why (rank -> reason; "sent no trace" where not given)."""
        results = {rank: value for rank, value in enumerate(values) if isinstance(value, dict)}
        missing = {**{r: "it sent no trace" for r in range(len(values)) if r not in results}, **(missing or {})}
        return cls(results, offsets, world_size=len(values), missing=missing)

    def events(self, rank: int | None = None, kind: str | None = None) -> list[dict]:
        """The merged events as plain dicts, start order per thread: ``name``, ``rank``, ``tid``,
        ``start_us`` (from the first op of any rank), ``dur_us`` (``start_ns``, ``dur_ns``: the same in whole
        nanoseconds), ``kind`` ("compute" or "communication"), ``cat`` and ``args`` (torch's; ``Input Dims``
        with record_shapes)."""
        if kind not in (None, COMPUTE, COMMUNICATION):
            raise ConfigError(f"kind must be None, {COMPUTE!r} or {COMMUNICATION!r}, got {kind!r}: "
                              "prof.events(kind='communication') lists the collectives.")
        if rank is not None and rank not in self.ranks:
            raise ConfigError(f"this profile has no rank {rank!r}; its ranks are {sorted(self.ranks)}.")
        return [dict(e, args=dict(e["args"])) for e in self._merged.events
                if (rank is None or e["rank"] == rank) and (kind is None or e["kind"] == kind)]

    def thread_name(self, rank: int, tid: int) -> str:
        """The timeline's name of an event's row: ``main``, a thread's name, or ``cuda:0 stream 7``."""
        return self._merged.threads.get((rank, tid), f"thread {tid}")

    def summary(self) -> Summary:
        """Per rank: span, compute, communication, communication overlapped with compute, idle (ms),
        and the top ops by self time. A table in the notebook; ``.rows`` for code."""
        return Summary(self._merged.events)

    def trace(self, rank: int) -> dict:
        """Rank ``rank``'s own trace, as its profiler wrote it (its own clock), with ``distributedInfo``: its
        rank and world size (and torch's backend and process groups where the group still existed as the
        profiler stopped)."""
        if rank not in self._traces:
            raise ConfigError(f"this profile has no rank {rank!r}; its ranks are {sorted(self._traces)}.")
        return self._traces[rank]

    def save(self, path) -> str:
        """Write one Chrome-trace JSON of every rank (pid = rank, named "rank N"), which
        ui.perfetto.dev and chrome://tracing open as it is, and beside it, in ``<name>.ranks/``, each rank's
        own trace as ``rank<r>.pt.trace.json`` (what HTA's ``TraceAnalysis(trace_dir=...)`` and TensorBoard's
        profiler plugin read: a folder of one trace per rank; another rank's file, from an earlier save there, is
        removed). Ranks without a trace (``missing``) are listed, with why, in the merged trace's
        ``ppkitMissingRanks`` and in ``missing.txt`` beside the ranks' traces. Returns the merged trace's path."""
        if not self._traces:
            raise ConfigError("this profile holds no rank's trace, so there is nothing to save"
                              + (f": {self._missing_text()}." if self.missing else ".")
                              + " Profile the run again once it runs through.")
        path = os.fspath(path)
        merged = merge.chrome_trace(self._merged)
        if self.missing:
            merged["ppkitMissingRanks"] = {str(rank): why for rank, why in self.missing.items()}
        with open(path, "w", encoding="utf-8") as file:
            json.dump(merged, file)
        folder = ranks_folder(path)
        os.makedirs(folder, exist_ok=True)
        for name in os.listdir(folder):  # an earlier save's other ranks would join this run's in HTA's reading
            match = re.fullmatch(r"rank(\d+)\.pt\.trace\.json", name)
            if match and int(match[1]) not in self._traces:
                os.remove(os.path.join(folder, name))
        for rank, trace in self._traces.items():
            with open(os.path.join(folder, f"rank{rank}.pt.trace.json"), "w", encoding="utf-8") as file:
                json.dump(trace, file)
        listed = os.path.join(folder, "missing.txt")
        if self.missing:
            with open(listed, "w", encoding="utf-8") as file:
                file.write("".join(f"rank {rank}: {why}\n" for rank, why in self.missing.items()))
        elif os.path.exists(listed):  # an earlier save's
            os.remove(listed)
        return path

    def _missing_text(self) -> str:
        """``no trace from rank 1: why``, the ranks of one reason said once."""
        ranks: dict[str, list[int]] = {}
        for rank, why in self.missing.items():
            ranks.setdefault(why, []).append(rank)
        return "; ".join(f"no trace from rank {these[0]}: {why}" if len(these) == 1 else
                         f"no trace from ranks {these}: {why}" for why, these in ranks.items())

    def timeline(self):
        """The interactive timeline (a plotly figure as ``.figure``); what the profile shows as."""
        from ppkit.profiling.timeline import Timeline

        return Timeline(self._merged)

    def _repr_html_(self) -> str:
        return self.timeline()._repr_html_()

    def __repr__(self) -> str:
        events = self._merged.events
        span = max((e["start_us"] + e["dur_us"] for e in events), default=0.0) / 1000
        missing = f"; {self._missing_text()}" if self.missing else ""
        return (f"<ppkit.Profile: {len(self.ranks)} ranks, {len(events)} ops over {span:.1f} ms{missing}; "
                ".summary(), .save(path), .timeline()>")


def ranks_folder(path: str) -> str:
    """Where ``save(path)`` puts each rank's own trace: ``step.json`` -> ``step.ranks``."""
    root, ext = os.path.splitext(path)
    return (root if ext == ".json" else path) + ".ranks"


def _with_rank(trace: dict, rank: int, world_size: int | None) -> dict:
    """The trace with ``distributedInfo`` (HTA reads a folder's traces by it, and raises without it): as the
    rank wrote it where it has one (collect.with_distributed_info), else the rank and the world size."""
    if "distributedInfo" in trace:
        return trace
    info = {"rank": rank} if world_size is None else {"rank": rank, "world_size": world_size}
    return {**trace, "distributedInfo": info}


def _applied(results: dict[int, dict], offsets: dict[int, Offset], here: str) -> dict[int, float]:
    """By rank, the offset to take off: one per clock other than ``here``'s, for all its ranks or none."""
    by_clock: dict[str, list[int]] = {}
    for rank, result in results.items():
        clock = result.get("clock", result.get("host", here))
        if clock != here and rank in offsets:
            by_clock.setdefault(clock, []).append(rank)
    applied = {}
    for ranks in by_clock.values():
        offset = clocks.shared([offsets[rank] for rank in ranks])
        if offset.applies():
            applied.update(dict.fromkeys(ranks, offset.offset_us))
    return applied


def _parsed(result: dict) -> dict:
    """A rank's result with its trace as a dict (a rank sends the JSON text, collect.trace_of)."""
    if "trace" in result or "trace_json" not in result:
        return result
    return {**{k: v for k, v in result.items() if k != "trace_json"}, "trace": json.loads(result["trace_json"])}
