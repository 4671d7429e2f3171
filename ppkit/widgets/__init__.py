"""Notebook widgets (ipywidgets) for ppkit lessons."""
