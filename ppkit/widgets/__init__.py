"""Interactive widgets for the notebooks (ipywidgets)."""

from ppkit.widgets.collectives import CollectivesExplorer
from ppkit.widgets.sharding import TensorParallelExplorer, ZeroExplorer

__all__ = ["CollectivesExplorer", "TensorParallelExplorer", "ZeroExplorer"]
