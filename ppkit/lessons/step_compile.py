"""Lesson 08c: ``torch.compile`` on lesson 08b's block, on CPU: what Inductor generated, the time and the memory.

    require_compiler  the C++ compiler Inductor needs on CPU, or a ConfigError that says what to install
    compiled          ``torch.compile(block, dynamic=False)``: one shape, no guards on sizes; built at the first call
    compile_blocks    each block of a GPT replaced by its compiled self
    generated         one forward and backward of a compiled block, and what Inductor wrote for it: its fused C++
                      kernels (``cpp_fused_<the operators fused>_<n>``), its calls into the matmul library, the
                      buffers its forward allocates; with the seconds it took and whether Inductor's on-disk cache
                      already had the code (then it loads what it built before instead of compiling)
    eager_forward_buffers  the same block's forward in eager mode: how many new tensors its operators write, bytes
    saved_bytes       what one block keeps for backward, eager and compiled: bytes and tensor count

Inductor turns the graph Dynamo captured into C++ loops (one per group of elementwise and reduction operators it
fuses) around calls to the same matmul library eager uses (``extern_kernels.mm``/``addmm``/``bmm``): fusion saves
the trips through memory between the small operators, not matmul FLOPs. Its partitioner also decides what the
forward keeps for backward and what backward recomputes.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ppkit import compat
from ppkit.errors import ConfigError
from ppkit.lessons import step_memory as sm
from ppkit.lessons.cpu_threads import threads

KERNEL = re.compile(r"^(cpp_fused_\w+) = ", re.MULTILINE)
EXTERN = re.compile(r"extern_kernels\.(\w+)\(")
BUFFER = re.compile(r"^\s*buf\d+ = empty_strided_cpu\(\(([^)]*)\), \([^)]*\), torch\.(\w+)\)", re.MULTILINE)


def require_compiler() -> str:
    """The C++ compiler Inductor will use; a ConfigError naming what to do if there is none."""
    try:
        return compat.inductor_cpp_compiler()
    except RuntimeError as err:
        raise ConfigError(
            f"torch.compile cannot build kernels on this machine: on CPU Inductor writes C++ and compiles it, and "
            f"no working C++ compiler was found ({err}). Install one (Debian/Ubuntu: apt install g++; macOS: "
            "xcode-select --install; conda: conda install gxx) or name it with CXX=..., then restart the kernel. "
            "The rest of the notebook runs without it.") from err


def compiled(block: nn.Module) -> nn.Module:
    """``torch.compile(block, dynamic=False)`` once a compiler is known to be there (built at the first call).

    Inductor builds the kernels in a pool of processes, one per core (``compile_threads``): with a cold cache on 2
    busy cores that took this block 36 s, against 82 s one at a time."""
    require_compiler()
    return torch.compile(block, dynamic=False)


def compile_blocks(model: sm.GPT) -> sm.GPT:
    """Compile each block of ``model`` in place; returns the model."""
    for i, block in enumerate(model.blocks):
        model.blocks[i] = compiled(block)
    return model


@dataclass(frozen=True)
class Generated:
    """What Inductor made for one block: fused C++ kernels and library calls, forward and backward."""
    forward_kernels: tuple[str, ...]
    backward_kernels: tuple[str, ...]
    library_calls: dict[str, int]
    forward_buffers: int          # tensors the generated forward allocates
    forward_buffer_bytes: int
    seconds: float                # to trace, compile (or load) and run forward and backward once
    cache_hits: int               # graphs Inductor found in its on-disk cache
    files: tuple[str, ...]        # the generated Python modules (forward, backward)

    @property
    def cache(self) -> str:
        return "warm: loaded from Inductor's cache" if self.cache_hits else "cold: generated and compiled now"


def _block_input(size: sm.Size, s: int, b: int) -> tuple[nn.Module, torch.Tensor]:
    model = sm.GPT(size)
    x = model.embed(sm.batch(size, b, s)[:, :-1]).detach().requires_grad_()
    return model.blocks[0], x


def _buffers(source: str) -> tuple[int, int]:
    found = BUFFER.findall(source)
    sizes = [math.prod(int(d) for d in shape.split(",") if d.strip()) * getattr(torch, dtype).itemsize
             for shape, dtype in found]
    return len(sizes), sum(sizes)


def generated(size: sm.Size = sm.SIZE, s: int = 128, b: int = 4) -> Generated:
    """Compile one block, run its forward and backward once, and read what Inductor generated.

    It starts with ``torch.compiler.reset()``: code this process compiled before is forgotten (a model compiled
    earlier compiles again at its next call, from Inductor's disk cache), so that a second call, or a rerun of the
    cell, builds the graph again and sees its files rather than reusing them unseen."""
    from torch._dynamo.utils import counters

    torch.compiler.reset()
    block, x = _block_input(size, s, b)
    fast = compiled(block)
    before, hits = len(compat.inductor_generated_files()), counters["inductor"]["fxgraph_cache_hit"]
    start = time.perf_counter()
    with threads():
        fast(x).sum().backward()
    seconds = time.perf_counter() - start
    files = tuple(compat.inductor_generated_files()[before:])
    sources = [open(f).read() for f in files]  # noqa: SIM115 - small files, read once
    kernels = [tuple(KERNEL.findall(src)) for src in sources] + [(), ()]
    calls: dict[str, int] = {}
    for src in sources:
        for name in EXTERN.findall(src):
            calls[name] = calls.get(name, 0) + 1
    count, nbytes = _buffers(sources[0]) if sources else (0, 0)
    return Generated(kernels[0], kernels[1], calls, count, nbytes, seconds,
                     counters["inductor"]["fxgraph_cache_hit"] - hits, files)


class _NewTensors(TorchDispatchMode):
    """Every new storage an operator writes (a view writes none)."""

    def __init__(self, known: set[int]):
        super().__init__()
        self.known, self.count, self.bytes = known, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.known:
                self.known.add(t.untyped_storage().data_ptr())
                self.count, self.bytes = self.count + 1, self.bytes + t.untyped_storage().nbytes()
        return out


def eager_forward_buffers(size: sm.Size = sm.SIZE, s: int = 128, b: int = 4) -> dict[str, int]:
    """How many new tensors one block's eager forward writes, and their bytes: every operator's output."""
    block, x = _block_input(size, s, b)
    known = {x.untyped_storage().data_ptr()} | {p.untyped_storage().data_ptr() for p in block.parameters()}
    with threads(), _NewTensors(known) as seen:
        block(x)
    return {"tensors": seen.count, "bytes": seen.bytes}


def saved_bytes(size: sm.Size = sm.SIZE, s: int = 128, b: int = 4, compile: bool = False) -> dict[str, int]:
    """Bytes and number of tensors one block's forward keeps for backward (its parameters left out)."""
    block, x = _block_input(size, s, b)
    run = compiled(block) if compile else block
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    storages: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params:
            storages[key] = t.untyped_storage().nbytes()
        return t

    with threads(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run(x)
    return {"bytes": sum(storages.values()), "tensors": len(storages)}
