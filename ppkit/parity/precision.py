"""The precision a run computed in, which can be lower than the dtype of what it records: autocast computes
matmuls in bfloat16 from float32 parameters, FSDP2's ``MixedPrecisionPolicy(param_dtype=torch.bfloat16,
reduce_dtype=torch.float32)`` computes in bfloat16 and hands back float32 gradients, and a GPU with TF32 on
rounds a float32 matmul's operands to 10 mantissa bits. A tolerance derived from the recorded dtype would call
their rounding a bug.

``Seen`` is what the recorder saw, each source with its words for the report: the learner's ``precision=``, the
loss's autograd graph (it keeps each op's output dtype after backward; a float32 graph says the forward ran in
float32), autocast on at the record call (only where there is no graph: a block left open around ``record`` says
nothing about a forward that ran outside it), FSDP2's policies (a bfloat16 layer's rounding reaches every later
activation and so every gradient: the whole step is judged in it, even where the policy covers part of the model),
and TF32 flags for a model on a GPU. What it cannot see: an autocast region that ended before ``record`` when the
loss is passed as a number; then ``precision=`` says it. What one rank sees for a whole step ``compare_runs``
applies to every rank's tensors of that step: a pipeline's first stage, which holds no loss, computed in what the
last stage's graph shows.
"""

from __future__ import annotations

import torch
from torch import nn

# eps of each precision a tensor can be computed in; "tf32" is no torch dtype (10 mantissa bits, fp32's range)
EPS = {"torch.float64": torch.finfo(torch.float64).eps, "torch.float32": torch.finfo(torch.float32).eps,
       "tf32": 2.0 ** -10, "torch.float16": torch.finfo(torch.float16).eps,
       "torch.bfloat16": torch.finfo(torch.bfloat16).eps}
_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def name(dtype) -> str:
    """``torch.bfloat16`` -> "torch.bfloat16"; "tf32" and other strings unchanged."""
    return dtype if isinstance(dtype, str) else str(dtype)


def least_precise(*dtypes: str) -> str:
    """The precision with the largest eps among ``dtypes`` ("" ignored; an unknown one wins, for the tolerance to
    refuse it by name)."""
    known = [d for d in dtypes if d]
    unknown = [d for d in known if d not in EPS]
    return unknown[0] if unknown else max(known, key=EPS.__getitem__, default="")


class Seen:
    """The lower precisions seen at one record call: ``everywhere`` (dtype, why) for every tensor of the step;
    ``by_param``: id(parameter) -> (dtype, why) from FSDP2's policy on the module holding it."""

    def __init__(self, model, loss, explicit: str = ""):
        self.everywhere: list[tuple[str, str]] = []
        if explicit:
            self.everywhere.append((explicit, "precision= given to ParityRecorder"))
        # the graph shows what the forward ran in; autocast's state at the record call only where there is none (a
        # block left open around record, in a kernel, says nothing about a forward that ran outside it)
        self.graph = _graph_dtype(loss)
        if self.graph and EPS[self.graph] > EPS["torch.float32"]:
            self.everywhere.append((self.graph, f"the loss's autograd graph computed in "
                                                f"{self.graph.removeprefix('torch.')} (autocast, or a cast of the "
                                                "model or its inputs)"))
        for device in ("cpu", "cuda"):
            if not self.graph and torch.is_autocast_enabled(device):
                dtype = name(torch.get_autocast_dtype(device))
                self.everywhere.append((dtype, f"autocast ({device}, {dtype.removeprefix('torch.')}) on at record"))
        modules = _modules(model)
        self.by_param = _fsdp_param_dtypes(modules)
        if self.by_param:  # a layer's rounding reaches every later activation, and through them every gradient
            dtype, why = self.by_param[max(self.by_param, key=lambda k: EPS[self.by_param[k][0]])]
            self.everywhere.append((dtype, f"{why} on {'part' if _partly(modules, self.by_param) else 'all'} of "
                                           "the model, whose rounding every later layer's activations and so every "
                                           "gradient of the step carry"))
        tf32 = _tf32(modules)
        if tf32:
            self.everywhere.append(("tf32", tf32))

    def of(self, recorded: str, param=None) -> tuple[str, str]:
        """The precision a tensor recorded in ``recorded`` (held by ``param``, if a parameter) was computed in,
        and why; the loss: ``param`` None and every FSDP2 policy of the model counted."""
        found = [(recorded, "the recorded dtype")] + self.everywhere
        if param is not None:
            found += [self.by_param[id(param)]] if id(param) in self.by_param else []
        else:
            found += list(self.by_param.values())
        dtype = least_precise(*(d for d, _ in found))
        return dtype, next(why for d, why in found if d == dtype)


def _graph_dtype(loss) -> str:
    """The least precise floating dtype among the outputs of the ops that made ``loss`` ("torch.float32" for a
    graph that ran in float32; "" when there is no graph: a number, a detached tensor)."""
    node = getattr(loss, "grad_fn", None)
    seen, todo, dtypes = set(), [node], set()
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for meta in getattr(node, "_input_metadata", None) or ():
            dtype = getattr(meta, "dtype", None)
            if dtype in _FLOATS:
                dtypes.add(name(dtype))
        todo += [child for child, _ in node.next_functions]
    return least_precise(*dtypes)


def _partly(modules: list[nn.Module], by_param: dict) -> bool:
    return any(id(p) not in by_param for m in modules for p in m.parameters())


def _modules(model) -> list[nn.Module]:
    if isinstance(model, nn.Module):
        return [model]
    if isinstance(model, (list, tuple)):
        return [m for m in model if isinstance(m, nn.Module)]
    return []


def _fsdp_param_dtypes(modules: list[nn.Module]) -> dict[int, tuple[str, str]]:
    """id(parameter) -> (param_dtype, why) for parameters of FSDP2 modules whose policy computes below fp32; an
    inner module's policy over its outer one's, as FSDP2 applies them."""
    found: dict[int, tuple[str, str]] = {}
    for root in modules:
        for module in root.modules():  # outer modules first
            get_state = getattr(module, "_get_fsdp_state", None)
            policy = getattr(get_state(), "_mp_policy", None) if callable(get_state) else None
            dtype = getattr(policy, "param_dtype", None)
            if dtype is None:
                continue
            why = (f"FSDP2's MixedPrecisionPolicy(param_dtype={dtype}, "
                   f"reduce_dtype={getattr(policy, 'reduce_dtype', None)})")
            for param in module.parameters():
                found[id(param)] = (name(dtype), why)
    return {k: v for k, v in found.items() if EPS.get(v[0], 1.0) > EPS["torch.float32"]}


def _tf32(modules: list[nn.Module]) -> str:
    """Why a float32 model on a GPU computes in TF32, or ""."""
    params = [p for m in modules for p in m.parameters()]
    if not any(p.is_cuda and p.dtype == torch.float32 for p in params):
        return ""
    if torch.backends.cuda.matmul.allow_tf32:
        return "TF32 matmuls on the GPU (torch.backends.cuda.matmul.allow_tf32, set_float32_matmul_precision)"
    convs = any(isinstance(x, nn.modules.conv._ConvNd) for m in modules for x in m.modules())
    if convs and torch.backends.cudnn.allow_tf32:
        return "TF32 convolutions on the GPU (torch.backends.cudnn.allow_tf32, on by default)"
    return ""
