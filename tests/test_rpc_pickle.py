"""Code defined in a notebook cell (``__main__``) in every RPC path of a ppkit RPC world.

The cell is played by ``exec`` with ``__name__ == "__main__"``, as IPython runs a cell, so its
functions and classes have ``__module__ == "__main__"`` and no worker can import them by name.
"""

from __future__ import annotations

import pickle
import threading

import pytest
import torch
from torch.distributed import rpc

import ppkit
from ppkit.cluster.rpc import pickler as rpc_pickle

CELL = '''
import threading
import torch
from torch.distributed import rpc

class Counter:
    def __init__(self, start):
        self.value = start
    def add(self, n):
        self.value += n
        return self.value
    def twin(self):  # an instance of a cell class as a return value
        return Counter(self.value)
    def numbers(self):
        return (i for i in range(3))

class Holder:
    def __init__(self, thing):
        self.thing = thing

def bump(counter, n):
    counter.value += n
    return counter

def numbers_of(n):
    return (i for i in range(n))

def relay(to, start):
    """Runs on one worker: builds a Counter on another, calls its helpers from there."""
    rref = rpc.remote(to, Counter, args=(start,))
    twin = rref.remote().twin().to_here()
    return rref.rpc_sync().add(1), rref.rpc_async().add(1).wait(), type(twin).__name__, twin.value
'''


def run_cell(source: str) -> dict:
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)
    return namespace


# -- without a world ---------------------------------------------------------------------------
def test_only_code_no_process_can_import_ships_by_value():
    cell = run_cell(CELL)

    def local():
        pass

    assert rpc_pickle.ships_by_value(cell["Counter"]) and rpc_pickle.ships_by_value(cell["bump"])
    assert rpc_pickle.ships_by_value(local) and rpc_pickle.ships_by_value(lambda: 0)
    assert not rpc_pickle.ships_by_value(torch.nn.Linear)
    assert not rpc_pickle.ships_by_value(run_cell)  # importable: tests.test_rpc_pickle.run_cell
    assert not rpc_pickle.ships_by_value(cell["Counter"](1))  # instances pickle as usual


def test_installed_only_while_a_world_runs_and_a_changed_torch_is_named(monkeypatch):
    from torch.distributed.rpc import internal

    assert not rpc_pickle.installed() and internal._pickler is pickle.Pickler
    rpc_pickle.install()
    try:
        assert internal._pickler is rpc_pickle.MainByValuePickler
    finally:
        rpc_pickle.uninstall()
    assert internal._pickler is pickle.Pickler
    assert not {"serialize", "deserialize"} & set(vars(internal._internal_rpc_pickler))

    monkeypatch.delattr(internal, "_pickler")
    with pytest.raises(ppkit.ClusterStateError, match=r"no torch.distributed.rpc.internal._pickler,"
                                                      r" which ppkit replaces.*pip install"):
        rpc_pickle.install()
    assert not rpc_pickle.installed()
    with pytest.raises(ppkit.ClusterStateError, match=r"internal._pickler"):
        ppkit.start_rpc(2)  # refused before any process starts
    assert ppkit.cluster.rpc.world.active() is None


# -- in a world --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world():
    w = ppkit.start_rpc(2, rpc_timeout=30)
    yield w
    w.close()


@pytest.fixture(scope="module")
def cell():
    return run_cell(CELL)


def test_cell_functions_and_classes_in_rpc_sync_async_and_remote(world, cell):
    Counter, bump = cell["Counter"], cell["bump"]
    back = rpc.rpc_sync("worker1", bump, args=(Counter(1), 2))
    assert type(back) is Counter and back.value == 3  # the kernel's own class, not a copy
    assert rpc.rpc_async("worker2", bump, args=(Counter(5), 1)).wait().value == 6
    rref = rpc.remote("worker2", Counter, args=(7,))
    assert rref.owner().name == "worker2" and rref.to_here().value == 7


def test_rref_helpers_on_a_cell_class_master_to_worker(world, cell):
    rref = rpc.remote("worker1", cell["Counter"], args=(10,))
    assert rref.rpc_sync().add(1) == 11
    assert rref.rpc_async().add(1).wait() == 12
    twin = rref.remote().twin().to_here()  # the owner sends the type back first
    assert type(twin) is cell["Counter"] and twin.value == 12


def test_rref_helpers_on_a_cell_class_worker_to_worker(world, cell):
    assert rpc.rpc_sync("worker1", cell["relay"], args=("worker2", 5)) == (6, 7, "Counter", 5)
    assert rpc.rpc_sync("worker2", cell["relay"], args=("worker1", 0)) == (1, 2, "Counter", 0)


def test_by_value_still_works(world, cell):
    assert rpc.rpc_sync("worker1", ppkit.by_value(cell["bump"]),
                        args=(cell["Counter"](0), 4)).value == 4


def test_what_cannot_be_pickled_is_named_with_the_call_and_what_to_do(world, cell, tmp_path):
    bump, Holder = cell["bump"], cell["Holder"]
    with pytest.raises(ppkit.RpcPickleError, match=r"master could not send the call bump\(\.\.\.\)"
                       r": argument 0 is a _thread.lock .*create them where they are used"):
        rpc.rpc_sync("worker1", bump, args=(threading.Lock(), 1))
    with open(tmp_path / "data.txt", "w") as file:
        with pytest.raises(ppkit.RpcPickleError, match=r"argument 1.thing is a _io.TextIOWrapper"):
            rpc.rpc_async("worker2", bump, args=(0, Holder(file)))
    rref = rpc.remote("worker1", cell["Counter"], args=(0,))
    with pytest.raises(ppkit.RpcPickleError, match=r"call rref.<rpc_sync\|rpc_async\|remote>\(\)"
                       r"\.add\(\.\.\.\) to worker1: argument 0 is a builtins.generator"):
        rref.rpc_sync().add(i for i in range(2))
    # A result that cannot travel: torch re-raises the callee's error as its builtin base class
    with pytest.raises(TypeError, match=r"RpcPickleError: worker1 could not send back the result "
                       r"of rref.<rpc_sync\|rpc_async\|remote>\(\).numbers\(\.\.\.\): the value "
                       r"is a builtins.generator"):
        rref.rpc_sync().numbers()
    with pytest.raises(TypeError, match=r"could not send back the result of numbers_of\(\.\.\.\)"):
        rpc.rpc_async("worker2", cell["numbers_of"], args=(3,)).wait()
    # to_here() is served later, on any thread: named when that thread ran the call that made it
    with pytest.raises(ppkit.RpcPickleError, match=r"worker1 could not send back (a value|the result "
                       r"of rref.<rpc_sync\|rpc_async\|remote>\(\).numbers).*builtins.generator"):
        rref.remote().numbers().to_here()
    assert rref.rpc_sync().add(2) == 2  # the world still works
