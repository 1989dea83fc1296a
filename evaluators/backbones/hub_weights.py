"""Weight files of timm and OpenCLIP models: the local Hugging Face cache first, a download
only when a user asks for a model that is not cached, and one line, fast, when there is no
network (the libraries' own clients would retry for minutes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from bench.core.errors import BenchError
from evaluators.backbones.hub import STALL_DEADLINE_S, Download, hub_cache_dir, with_stall_deadline


def cached_hub_file(repo_id: str, filenames: Sequence[str]) -> Path | None:
    """The first of `filenames` of a hub repo that the local cache holds, or None."""
    from huggingface_hub import try_to_load_from_cache

    for name in filenames:
        path = try_to_load_from_cache(repo_id, name, cache_dir=hub_cache_dir())
        if isinstance(path, str):
            return Path(path)
    return None


HOW = "run once where there is network to fill the cache, or point HF_HOME at a cache that holds it"


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def require_network(what: str, url: str | None = None) -> None:
    """A one-line BenchError unless the weights of `what` can be downloaded now."""
    weights_download(what, url).require()


def weights_download(what: str, url: str | None = None) -> Download:
    """The download of the weights of `what` (from `url`, else the hub), not yet made."""
    return Download(f"the weights of {what}", HOW, url)


def hub_file_download(what: str, repo_id: str, filenames: Sequence[str]) -> Download | None:
    """The download `hub_file` makes: None when the cache holds one of `filenames`."""
    return None if cached_hub_file(repo_id, filenames) is not None else weights_download(what)


def hub_file(what: str, repo_id: str, filenames: Sequence[str]) -> Path:
    """A weight file of a hub repo: cached, or downloaded now (the first of `filenames` the repo has)."""
    cached = cached_hub_file(repo_id, filenames)
    if cached is not None:
        return cached
    require_network(what)
    from huggingface_hub import hf_hub_download

    errors = []
    repo_dir = hub_cache_dir() / f"models--{repo_id.replace('/', '--')}"
    for name in filenames:
        try:
            return Path(with_stall_deadline(  # the hub client sets no read timeout
                lambda name=name: hf_hub_download(repo_id, name, cache_dir=hub_cache_dir(), endpoint=_endpoint()),
                repo_dir))
        except TimeoutError:
            raise BenchError(f"model: the weights of {what}: {_endpoint()} sent nothing for {STALL_DEADLINE_S:.0f} s; "
                             f"{HOW}") from None
        except Exception as e:  # missing file, auth, network: try the next name, report the last
            errors.append(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
    raise BenchError(f"model: could not download the weights of {what} from {repo_id} ({errors[-1]}); {HOW}")
