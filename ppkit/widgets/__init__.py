"""Interactive widgets for the notebooks (ipywidgets)."""

from ppkit.widgets.collectives import CollectivesExplorer

__all__ = ["CollectivesExplorer"]
