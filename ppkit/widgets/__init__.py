"""Interactive widgets for the notebooks (ipywidgets)."""

from ppkit.widgets.collectives import CollectivesExplorer
from ppkit.widgets.composition import MeshExplorer
from ppkit.widgets.context_parallel import RingAttentionExplorer
from ppkit.widgets.expert_parallel import MoEExplorer
from ppkit.widgets.overlap import OverlapExplorer
from ppkit.widgets.sharding import TensorParallelExplorer, ZeroExplorer
from ppkit.widgets.step_memory import StepMemoryExplorer
from ppkit.widgets.step_speed import StepSpeedExplorer

__all__ = ["CollectivesExplorer", "MeshExplorer", "MoEExplorer", "OverlapExplorer", "RingAttentionExplorer",
           "StepMemoryExplorer", "StepSpeedExplorer", "TensorParallelExplorer", "ZeroExplorer"]
