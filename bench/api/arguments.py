"""The types the API's arguments take: a path, a model (or several), a sink for progress lines."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence, Union

if TYPE_CHECKING:  # importing a backbone imports torch: only `evaluate` needs it, when called
    from evaluators.backbones.base import Backbone
    from evaluators.backbones.module_adapter import ModuleAdapter

PathLike = Union[str, "os.PathLike[str]"]
#: What `evaluate` takes as models: a spec string (as `bench models` lists them), `NAME=SPEC`,
#: a backbone object, a `ModuleAdapter` (a plain module), a sequence of those, or a mapping
#: display name -> spec or object.
OneModel = Union[str, "Backbone", "ModuleAdapter"]
Models = Union[OneModel, Sequence[OneModel], Mapping[str, OneModel]]
#: Where a function's one-line messages go (what was set aside, what was written), or None for nowhere.
Say = Optional[Callable[[str], None]]
