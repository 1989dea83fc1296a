"""The Hugging Face hub: its local cache, and the network every download from it goes over.

A download is tried only when the files are not cached and HF_HUB_OFFLINE is unset, after a
quick reachability probe, so that a machine without network fails in seconds, not after the
client's retries; and it runs under a watchdog that gives up once no byte arrives for
STALL_DEADLINE_S (the hub client's sockets have no read timeout). `hf.load_hub` and the timm
and OpenCLIP weight files (`hub_weights`) both go through here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bench.core.errors import BenchError

#: What a hub id's snapshot download fetches: the config, the processor config and the weights.
HUB_FILES = ["config.json", "preprocessor_config.json", "*.safetensors", "*.safetensors.index.json"]


def hub_cache_dir() -> Path:
    """The hub cache the huggingface_hub client would use, read from the environment now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def cached_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The local snapshot directory of a hub repo, or None when it is not cached."""
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(repo_id, revision=revision, local_files_only=True, cache_dir=hub_cache_dir()))
    except Exception:  # any "not cached" flavour of the client's errors
        return None
    return path if (path / "config.json").is_file() else None


@dataclasses.dataclass(frozen=True)
class Download:
    """What loading a backbone fetches from the network, its files not being in the local
    cache: `what` (shown), what to do without network (`how`), and the endpoint asked."""

    what: str
    how: str
    endpoint: str | None = None

    def require(self) -> None:
        """A one-line BenchError unless the download can work now (`require_network`)."""
        require_network(self.what, self.how, self.endpoint)


def hub_download(repo_id: str, revision: str | None = None) -> Download | None:
    """The download `load_hub` makes for a hub id: None when its snapshot is cached."""
    return None if cached_snapshot(repo_id, revision) is not None else Download(repo_id, _how(repo_id))


def _how(repo_id: str) -> str:
    return (f"download it where there is network (`hf download {repo_id}`) and pass its directory as the model, "
            "or point HF_HOME at a cache that holds it")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def require_network(what: str, how: str, endpoint: str | None = None) -> None:
    """A one-line BenchError unless a download of `what` (not in the local cache) can work
    now: HF_HUB_OFFLINE unset and the endpoint reachable within the probe's deadline."""
    endpoint = endpoint or os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if _offline():
        raise BenchError(f"model: {what} is not in the local Hugging Face cache ({hub_cache_dir()}) "
                         f"and HF_HUB_OFFLINE is set; {how}")
    if not _reachable(endpoint):
        raise BenchError(f"model: {what} is not in the local Hugging Face cache and could not be downloaded "
                         f"({urlparse(endpoint).hostname or endpoint} is unreachable); {how}")


def download_snapshot(repo_id: str, revision: str | None) -> Path:
    """A hub repo's config and weights (`HUB_FILES`) downloaded into the local cache now, its
    snapshot folder returned; a one-line BenchError without network, on a stall or a failure."""
    from huggingface_hub import snapshot_download

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    how = _how(repo_id)
    require_network(repo_id, how, endpoint)
    repo_dir = hub_cache_dir() / f"models--{repo_id.replace('/', '--')}"
    try:
        return Path(with_stall_deadline(
            lambda: snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES, cache_dir=hub_cache_dir(),
                                      endpoint=endpoint),  # the one probed
            repo_dir))
    except TimeoutError:
        raise BenchError(f"model: {repo_id}: {endpoint} sent nothing for {STALL_DEADLINE_S:.0f} s; {how}") from None
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BenchError(f"model: {repo_id} could not be downloaded ({first}); {how}") from None


#: The reachability probe ends within this many seconds in all (connect + answer).
PROBE_DEADLINE_S = 10.0
#: A download fails once no byte has arrived for this long (the hub client sets no read timeout);
#: with the probe, a stalled hub fails within 30 s.
STALL_DEADLINE_S = 20.0


def _reachable(endpoint: str) -> bool:
    """Whether the endpoint answers an HTTP request within PROBE_DEADLINE_S, through the
    proxies the environment names (HTTPS_PROXY, HTTP_PROXY, NO_PROXY: urllib reads them).

    A server that accepts the connection and never answers is unreachable: a bare TCP
    connect would call it reachable and the download would then wait forever.
    """
    import urllib.error
    import urllib.request

    def probe() -> bool:
        try:
            # a fresh opener reads the proxy variables now (urlopen's global one keeps its first)
            opener = urllib.request.build_opener()
            opener.open(urllib.request.Request(endpoint, method="HEAD"), timeout=PROBE_DEADLINE_S).close()
        except urllib.error.HTTPError:  # it answered, if only with an error status
            return True
        return True

    try:
        return bool(with_stall_deadline(probe, None, PROBE_DEADLINE_S))
    except (OSError, ValueError):  # includes TimeoutError and URLError
        return False


def with_stall_deadline(fn: Any, watch: Path | None, deadline: float | None = None) -> Any:
    """`fn()`, run in a daemon thread and abandoned with TimeoutError once `deadline` s
    pass without progress (bytes growing under `watch`; without `watch`, a total deadline).

    The hub client's sockets have no read timeout, so only a watchdog bounds a stall: every
    network wait of the backbones (a snapshot, a timm or OpenCLIP weight file, the reachability
    probe) runs under it.
    """
    deadline = STALL_DEADLINE_S if deadline is None else deadline
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True, name="bench-network")
    thread.start()
    seen, last = -1, time.monotonic()
    while thread.is_alive():
        thread.join(min(1.0, deadline))
        size = _tree_bytes(watch) if watch is not None else 0
        if size != seen:
            seen, last = size, time.monotonic()
        elif thread.is_alive() and time.monotonic() - last >= deadline:
            raise TimeoutError(f"no progress for {deadline:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _tree_bytes(root: Path) -> int:
    total = 0
    for f in root.rglob("*") if root.is_dir() else ():
        with contextlib.suppress(OSError):  # the client renames files as they complete
            total += f.lstat().st_size
    return total
