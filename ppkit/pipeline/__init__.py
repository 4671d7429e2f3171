"""Pipeline parallelism over torch.distributed.rpc: ResNet50 in two shards, fed micro-batches.

    from ppkit.pipeline import PipelineModel, PipelineOptimizer, PipelineConfig, run_sweep
"""

from ppkit.pipeline.config import PipelineConfig, Placement, num_microbatches, parse_placement
from ppkit.pipeline.model import PipelineModel
from ppkit.pipeline.optimizer import PipelineOptimizer

__all__ = [
    "PipelineConfig",
    "PipelineModel",
    "PipelineOptimizer",
    "Placement",
    "num_microbatches",
    "parse_placement",
]
