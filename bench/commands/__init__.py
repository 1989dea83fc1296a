"""Command groups of the `bench` CLI; each module has `register(app)`."""
