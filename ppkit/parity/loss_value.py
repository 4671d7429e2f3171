"""A recorded loss as one number (record.py): a tensor or a number checked, averaged over ``mean_over``'s ranks
(a process group or a 1-D DeviceMesh) with an all_reduce, and the size of that group."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ppkit.errors import ConfigError


def loss_value(loss, group) -> float:
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise ConfigError(f"record(loss=...) got a tensor of shape {list(loss.shape)}: give the step's loss, "
                              "one number (reduce it with .mean() as the reference does).")
        loss = loss.detach().double().cpu().reshape(())
    elif isinstance(loss, (int, float)) and not isinstance(loss, bool):
        loss = torch.tensor(float(loss), dtype=torch.float64)
    else:
        raise ConfigError(f"record(loss=...) got {type(loss).__name__}: give a tensor or a number.")
    if group is not None:
        if hasattr(group, "get_group"):  # a 1-D DeviceMesh, such as mesh["dp"]
            group = group.get_group()
        loss = loss.clone()
        dist.all_reduce(loss, group=group)  # SUM then divide: gloo has no AVG
        loss /= dist.get_world_size(group)
    return float(loss)


def group_size(group) -> int:
    if hasattr(group, "get_group"):  # a 1-D DeviceMesh
        group = group.get_group()
    return dist.get_world_size(group)
