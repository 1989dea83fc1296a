"""Results store, the metric catalogue, the board, its renderings, plots, the report and the site; they read results."""
