"""One smoke step of the version matrix, run inside a venv that holds one torch/torchvision pair.

    python scripts/version_smoke.py cluster       # 2 ranks start, run a cell-style function, close
    python scripts/version_smoke.py collectives   # all nine collectives on 3 ranks, results checked
    python scripts/version_smoke.py rpc_reinit    # an RPC world, closed and started again in one process

Prints one line ``ok: ...`` and exits 0, or prints what went wrong and exits 1. The pipeline steps use
``ppkit pipeline --verify`` itself (see scripts/version_matrix.py).
"""

from __future__ import annotations

import sys


def _collectives(rank, world_size):
    """Each collective once; {op: "ok" | what went wrong}. One op this torch lacks does not hide the others."""
    import torch
    import torch.distributed as dist

    w, r = world_size, rank
    tri = w * (w + 1) / 2

    def broadcast():
        t = torch.tensor([float(r)])
        dist.broadcast(t, src=0)
        return t.item() == 0.0

    def all_reduce():
        t = torch.tensor([float(r + 1)])
        dist.all_reduce(t)
        return t.item() == tri

    def reduce():
        t = torch.tensor([float(r + 1)])
        dist.reduce(t, dst=0)
        return r != 0 or t.item() == tri

    def all_gather():
        out = [torch.zeros(1) for _ in range(w)]
        dist.all_gather(out, torch.tensor([float(r)]))
        return [o.item() for o in out] == [float(i) for i in range(w)]

    def gather():
        out = [torch.zeros(1) for _ in range(w)] if r == 0 else None
        dist.gather(torch.tensor([float(r)]), out, dst=0)
        return r != 0 or [o.item() for o in out] == [float(i) for i in range(w)]

    def scatter():
        t = torch.zeros(1)
        dist.scatter(t, [torch.tensor([float(i * 10)]) for i in range(w)] if r == 0 else None, src=0)
        return t.item() == r * 10

    def reduce_scatter():
        t = torch.zeros(1)
        dist.reduce_scatter(t, [torch.tensor([float(r + i)]) for i in range(w)])
        return t.item() == sum(src + r for src in range(w))

    def all_to_all():
        out = [torch.zeros(1) for _ in range(w)]
        dist.all_to_all(out, [torch.tensor([float(r * 10 + i)]) for i in range(w)])
        return [o.item() for o in out] == [float(src * 10 + r) for src in range(w)]

    def barrier():
        dist.barrier()
        return True

    got = {}
    for op in (broadcast, all_reduce, reduce, all_gather, gather, scatter, reduce_scatter, all_to_all, barrier):
        try:
            got[op.__name__] = "ok" if op() else "wrong result"
        except Exception as e:  # e.g. an op the gloo of this torch does not implement
            got[op.__name__] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
    return got


def cluster() -> str:
    import ppkit

    c = ppkit.start(2)
    try:
        got = c.run(lambda rank, world_size: rank * 2 + world_size)
    finally:
        c.close()
    if got != [2, 4]:
        raise AssertionError(f"cluster.run returned {got}, expected [2, 4]")
    return "2 ranks ran a lambda: [2, 4]"


def collectives() -> str:
    import ppkit

    c = ppkit.start(3)
    try:
        results = c.run(_collectives, timeout=120)
    finally:
        c.close()
    failed = sorted({f"{op} ({what})" for got in results for op, what in got.items() if what != "ok"})
    if failed:
        raise AssertionError("failed: " + "; ".join(failed))
    return f"{len(results[0])} collectives on 3 ranks: " + " ".join(results[0])


def rpc_reinit() -> str:
    import torch.distributed.rpc as rpc

    import ppkit

    for attempt in (1, 2):
        world = ppkit.start_rpc(2)
        try:
            got = rpc.rpc_sync("worker1", max, args=(attempt, 7))
            if got != 7:
                raise AssertionError(f"rpc_sync(max) returned {got} on world {attempt}")
        finally:
            world.close()
    return "an RPC world started, closed and started again; rpc_sync worked in both"


STEPS = {"cluster": cluster, "collectives": collectives, "rpc_reinit": rpc_reinit}


def main(argv) -> int:
    if len(argv) != 1 or argv[0] not in STEPS:
        print(f"usage: version_smoke.py {{{','.join(STEPS)}}}", file=sys.stderr)
        return 2
    try:
        print("ok:", STEPS[argv[0]]())
    except Exception as e:  # the matrix records the line; the traceback goes to the log
        import traceback

        traceback.print_exc()
        print(f"FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
