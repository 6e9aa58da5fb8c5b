"""The report data model and its renderers. Renderers never touch torch."""
