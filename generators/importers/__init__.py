"""Importers of real-image datasets from local copies (`bench import`)."""
