"""ppkit.transport.byvalue: cloudpickle that keeps each function's file name (cloudpickle 3.1.3
writes ``<dynamic-code>`` instead, and remote tracebacks then lose the learner's source lines)."""

import cloudpickle

from ppkit.transport import byvalue


def divide(x):
    return 1 / x


class Shard:
    def forward(self, x):
        return x + 1


def test_functions_and_methods_keep_their_file_name_and_behaviour():
    fn = byvalue.loads(byvalue.dumps(divide.__code__.replace(co_name="divide")))
    assert fn.co_filename == __file__
    # a function pickled by value (as a cell's would be) keeps the file name of its code
    copy = byvalue.loads(byvalue.dumps(lambda y: divide(y) * 2))
    assert copy.__code__.co_filename == __file__ and copy(4) == 0.5
    method = byvalue.loads(byvalue.dumps(type("Cell", (Shard,), {"f": lambda self: 3})))
    assert method.f.__code__.co_filename == __file__ and method().forward(1) == 2


def test_plain_cloudpickle_loads_what_byvalue_dumps():
    assert cloudpickle.loads(byvalue.dumps({"a": [1, 2]})) == {"a": [1, 2]}
