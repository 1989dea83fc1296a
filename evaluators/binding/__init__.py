"""The binding task: what probes are trained against (`task`), the probes of a family (`jobs`),
scores to result columns (`columns`) and the rows of a run (`rows`)."""
