"""How many bytes an op moved, from what the profiler wrote about it.

A collective's size is in its trace only where torch records it: with ``record_shapes`` gloo's op
(``gloo:all_reduce``) has its tensor's ``Input Dims`` and ``Input type``, and c10d's op
(``c10d::allreduce_``) its tensor list's dims without a dtype; nccl's ``record_param_comms`` has
``In msg nelems`` and ``dtype``. The two name a dtype in two vocabularies: ``Input type`` with C++
type names (``c10::BFloat16``, ``long int``), ``dtype`` with torch's ScalarType names (``BFloat16``,
``Long``). ITEM_BYTES holds both (tests/test_profile.py checks it against every dtype of torch); an
unknown name gives no size rather than a guess."""

from __future__ import annotations

import math

_SCALAR_TYPES = {  # ScalarType name: bytes per element
    "Bool": 1, "Byte": 1, "Char": 1, "Short": 2, "Int": 4, "Long": 8, "UInt16": 2, "UInt32": 4, "UInt64": 8,
    "Half": 2, "BFloat16": 2, "Float": 4, "Double": 8, "ComplexHalf": 4, "BComplex32": 4, "ComplexFloat": 8,
    "ComplexDouble": 16, "Float8_e4m3fn": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2": 1, "Float8_e5m2fnuz": 1,
    "Float8_e8m0fnu": 1, "Float4_e2m1fn_x2": 1, "QInt8": 1, "QUInt8": 1, "QInt32": 4, "QUInt4x2": 1,
    "QUInt2x4": 1, "Bits1x8": 1, "Bits2x4": 1, "Bits4x2": 1, "Bits8": 1, "Bits16": 2,
    **{f"Int{n}": 1 for n in range(1, 8)}, **{f"UInt{n}": 1 for n in range(1, 8)}}
_TYPE_NAMES = {  # the C++ type name the profiler writes as "Input type": bytes per element
    "bool": 1, "unsigned char": 1, "signed char": 1, "short int": 2, "int": 4, "long int": 8,
    "short unsigned int": 2, "unsigned int": 4, "long unsigned int": 8, "c10::Half": 2, "c10::BFloat16": 2,
    "float": 4, "double": 8, "c10::complex<c10::Half>": 4, "c10::complex<c10::BFloat16>": 4,
    "c10::complex<float>": 8, "c10::complex<double>": 16, "c10::qint8": 1, "c10::quint8": 1, "c10::qint32": 4,
    "c10::quint4x2": 1, "c10::quint2x4": 1, "c10::bits1x8": 1, "c10::bits2x4": 1, "c10::bits4x2": 1,
    "c10::bits8": 1, "c10::bits16": 2,
    **{f"c10::{name}": 1 for name in ("Float8_e4m3fn", "Float8_e4m3fnuz", "Float8_e5m2", "Float8_e5m2fnuz",
                                      "Float8_e8m0fnu", "Float4_e2m1fn_x2")},
    **{f"c10::dummy_int1_7_t<{n}>": 1 for n in range(1, 8)}, **{f"c10::dummy_uint1_7_t<{n}>": 1 for n in range(1, 8)}}
ITEM_BYTES = {**_SCALAR_TYPES, **_TYPE_NAMES}


def op_bytes(args: dict) -> int | None:
    """The bytes an op moved, where the trace says: a collective's message size (``In msg nelems`` and
    ``dtype``), else its tensor inputs' sizes (``Input Dims`` and ``Input type``, with record_shapes)."""
    nelems, dtype = args.get("In msg nelems"), args.get("dtype")
    if isinstance(nelems, int) and dtype in ITEM_BYTES:
        return nelems * ITEM_BYTES[dtype]
    total = 0
    for shape, name in zip(args.get("Input Dims") or [], args.get("Input type") or []):
        if _is_shape(shape) and name in ITEM_BYTES:
            total += math.prod(shape) * ITEM_BYTES[name]
    return total or None


def elements(args: dict) -> int | None:
    """How many elements an op's tensor inputs hold, tensor lists included (c10d's ops take a list and
    the profiler records no dtype for it): where the bytes are unknown, the size that is."""
    nelems = args.get("In msg nelems")
    if isinstance(nelems, int):
        return nelems
    total = 0
    for shape, name in zip(args.get("Input Dims") or [], args.get("Input type") or []):
        if name == "TensorList" and isinstance(shape, list) and all(_is_shape(s) for s in shape):
            total += sum(math.prod(s) for s in shape)
        elif _is_shape(shape) and name in ITEM_BYTES:
            total += math.prod(shape)
    return total or None


def _is_shape(shape) -> bool:
    """A tensor's dims as the profiler writes them (``[]``: a 0-d tensor where a dtype is named)."""
    return isinstance(shape, list) and all(isinstance(d, int) for d in shape)
