"""Pipeline parallelism over torch.distributed.rpc: ResNet50 in two shards, fed micro-batches.

    from ppkit.pipeline.rpc import PipelineModel, PipelineOptimizer, PipelineConfig
    from ppkit.pipeline.rpc.sweep import run_sweep
"""

from ppkit.pipeline.rpc.config import PipelineConfig, Placement, num_microbatches, parse_placement
from ppkit.pipeline.rpc.model import PipelineModel
from ppkit.pipeline.rpc.optimizer import PipelineOptimizer

__all__ = [
    "PipelineConfig",
    "PipelineModel",
    "PipelineOptimizer",
    "Placement",
    "num_microbatches",
    "parse_placement",
]
