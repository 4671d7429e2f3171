"""Interactive widgets for the notebooks (ipywidgets)."""

from ppkit.widgets.collectives import CollectivesExplorer
from ppkit.widgets.composition import MeshExplorer
from ppkit.widgets.context_parallel import RingAttentionExplorer
from ppkit.widgets.expert_parallel import MoEExplorer
from ppkit.widgets.sharding import TensorParallelExplorer, ZeroExplorer

__all__ = ["CollectivesExplorer", "MeshExplorer", "MoEExplorer", "RingAttentionExplorer", "TensorParallelExplorer",
           "ZeroExplorer"]
