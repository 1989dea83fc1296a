"""IsSameObject: the module moved to `evaluators.issameobject.evaluate` (the next commit splits it by concern)."""

from evaluators.issameobject.evaluate import *  # noqa: F401,F403
