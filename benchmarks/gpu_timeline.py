"""A profiled fit read as a timeline: where its wall time went, by fit stage, beside the time the
device was busy; the CUDA runtime's calls; what the host did while the device sat idle; and what a
process's first fit spent beyond its warm one (a part of `benchmarks/gpu.py`; `gpu_profile` runs
the profiled fits)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

from evaluators.fitting import STAGE_PREFIX


@contextmanager
def profiled(device: str) -> Iterator[dict]:
    """The block under `torch.profiler`; the dict yielded gets `timeline`'s reading of it, and the
    profile itself under "profile" (for its tables and trace, written later: they are slow)."""
    from torch.profiler import ProfilerActivity, profile

    got: dict = {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        yield got
    got.update(status="done", **timeline(spans_of(prof)), profile=prof)


def spans_of(prof) -> Iterator[tuple[str, float, float, bool]]:
    """A profile's events as (name, start µs, end µs, on the device), read from kineto's own list:
    `prof.events()` builds a Python tree of them first, 44 s for the 855,000 events of one CPU row
    set's fit, where this takes 2 s."""
    cpu = torch.autograd.DeviceType.CPU
    raw = getattr(prof.profiler, "kineto_results", None)
    if raw is None:  # a torch without kineto's list: the slow way
        for e in prof.events():
            yield e.name, e.time_range.start, e.time_range.end, e.device_type != cpu
        return
    for e in raw.events():
        yield e.name(), e.start_ns() / 1e3, e.end_ns() / 1e3, e.device_type() != cpu


def first_less_warm(first: dict, warm: dict) -> dict:
    """What the first fit spent beyond the warm one: wall and device-busy seconds, in all and per
    stage, and host seconds per CUDA runtime call (calls as `first/warm` where their counts differ)."""
    def less(a: dict, b: dict, key: str) -> float:
        return round(a.get(key, 0.0) - b.get(key, 0.0), 3)

    out = {"wall_s": less(first, warm, "wall_s"), "device_busy_s": less(first, warm, "device_busy_s"),
           "stages": {k: {"wall_s": less(v, warm["stages"].get(k, {}), "wall_s"),
                          "device_busy_s": less(v, warm["stages"].get(k, {}), "device_busy_s")}
                      for k, v in first["stages"].items()},
           "runtime_host_s": {}}
    for k in sorted(set(first["runtime"]) | set(warm["runtime"])):
        a, b = first["runtime"].get(k, {"calls": 0, "host_s": 0.0}), warm["runtime"].get(k, {"calls": 0, "host_s": 0.0})
        out["runtime_host_s"][k] = less(a, b, "host_s") if a["calls"] == b["calls"] else \
            {"host_s": less(a, b, "host_s"), "calls": f"{a['calls']}/{b['calls']}"}
    return out


#: CUDA runtime calls `timeline` counts: launches from the host, and the calls that wait for the device.
RUNTIME_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync",
                 "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaStreamWaitEvent",
                 "cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaGraphInstantiateWithFlags")


#: How many host operations `timeline` names beside the device's idle time.
IDLE_TOP = 15


def timeline(events: Iterable[tuple[str, float, float, bool]]) -> dict:
    """Where a profiled fit's time went (`spans_of` its profile, times in µs): its wall and the time
    the device was busy (the union of its kernels' and copies' intervals), in all and per fit stage
    (the `STAGE_PREFIX` labels; a stage met several times is summed); the CUDA runtime calls'
    counts and host seconds (`RUNTIME_CALLS`); and
    what the host was doing while the device sat idle: the idle time within each host operation
    (`IDLE_TOP` of them; nested ones each count it) and the idle time within none, the host's Python
    between operations. A stage whose busy share is low waited on the host."""
    device_spans, stages, runtime, host = [], {}, {}, {}
    for name, start, end, on_device in events:
        span = (start, end)
        if on_device:
            if not name.startswith(STAGE_PREFIX):  # a label's device-side twin spans its kernels: not one
                device_spans.append(span)
        elif name.startswith(STAGE_PREFIX):
            stages.setdefault(name[len(STAGE_PREFIX):], []).append(span)
        else:
            host.setdefault(name, []).append(span)
            if name in RUNTIME_CALLS:
                calls = runtime.setdefault(name, [0, 0.0])
                calls[0] += 1
                calls[1] += (span[1] - span[0]) / 1e6
    busy = _union(device_spans)
    every = [span for spans in stages.values() for span in spans]
    whole = (min(a for a, _ in every), max(b for _, b in every)) if every else \
        (min((a for a, _ in busy), default=0.0), max((b for _, b in busy), default=0.0))
    out = {"wall_s": round((whole[1] - whole[0]) / 1e6, 3), "device_busy_s": round(_overlap(busy, [whole]) / 1e6, 3),
           "stages": {}, "runtime": {k: {"calls": n, "host_s": round(t, 3)} for k, (n, t) in sorted(runtime.items())}}
    for name, spans in stages.items():
        wall = sum(b - a for a, b in spans)
        on = _overlap(busy, _union(spans))
        out["stages"][name] = {"wall_s": round(wall / 1e6, 3), "device_busy_s": round(on / 1e6, 3),
                               "busy_pct": round(100 * on / max(wall, 1e-9), 1)}
    out["busy_pct"] = round(100 * out["device_busy_s"] / max(out["wall_s"], 1e-9), 1)
    idle = _gaps(busy, whole)
    during = sorted(((_overlap(_union(spans), idle), name) for name, spans in host.items()), reverse=True)
    within_ops = _overlap(_union([span for spans in host.values() for span in spans]), idle)
    total = sum(b - a for a, b in idle)
    out["idle"] = {"seconds": round(total / 1e6, 3), "between_host_ops_s": round((total - within_ops) / 1e6, 3),
                   "within_host_op_s": {name: round(t / 1e6, 3) for t, name in during[:IDLE_TOP] if t > 0}}
    return out


def _gaps(spans: list[tuple[float, float]], window: tuple[float, float]) -> list[tuple[float, float]]:
    """The parts of `window` that the disjoint, sorted `spans` leave uncovered, in order."""
    out, at = [], window[0]
    for a, b in spans:
        if a > at:
            out.append((at, min(a, window[1])))
        at = max(at, b)
        if at >= window[1]:
            break
    if at < window[1]:
        out.append((at, window[1]))
    return [(a, b) for a, b in out if b > a]


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intervals merged where they overlap, in order."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(spans: list[tuple[float, float]], windows: list[tuple[float, float]]) -> float:
    """Length of the disjoint, sorted `spans` that lies within the disjoint, sorted `windows`."""
    total, i = 0.0, 0
    for a, b in windows:
        while i < len(spans) and spans[i][1] <= a:
            i += 1
        j = i
        while j < len(spans) and spans[j][0] < b:
            total += min(b, spans[j][1]) - max(a, spans[j][0])
            j += 1
    return total
