"""How `bench evaluate` runs: the request, the plan made of it, and its execution, locally or on Ray.

- `request`: `EvaluationRequest`, the request every caller describes its run as, checked when it is made.
- `planning`: every backbone made once and checked; the rows a run still owes (`Work`), the
  probes' fingerprints (`PROBE_CODE_VERSION`) and the cache's growth against free disk.
- `run`: `run_evaluation`, the local loop over backbones and seeds (and the front of the Ray path).
- `ray_executor`, `ray_tasks`: the run's units of work as Ray tasks, and how a task runs.
- `threads`: how many threads each part of a run may use.
"""
