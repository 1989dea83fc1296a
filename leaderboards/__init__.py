"""Results store, tables and plots; they read results."""
