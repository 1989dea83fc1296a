"""The GPU benchmark's report: the phases' results kept in `--json` as each is set (written whole),
the CPU/device ratios, and the table printed at the end (a part of `benchmarks/gpu.py`)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.core.dataset import write_text_atomic
from benchmarks.gpu_fits import ALLOCATOR_COUNTS, MODEL, PIXELS


class Phases(dict):
    """The phases' results, the report written to `path` (if any) each time one is set: a device
    session is short and lent rarely, and a run cut by its time limit or ended by a crash keeps
    what it had measured."""

    def __init__(self, report: dict, path: Path | None) -> None:
        super().__init__()
        self.report, self.path = report, path

    def __setitem__(self, name: str, value: dict) -> None:
        super().__setitem__(name, value)
        write_json(self.path, self.report)


def write_json(path: Path | None, report: dict) -> None:
    """The report at `path`, whole: written aside and moved in place, so a run killed while
    writing leaves the previous phase's report, never half of one."""
    if path is not None:
        write_text_atomic(json.dumps(report, indent=1, default=str), path)


def ratios(phases: dict) -> dict:
    """CPU seconds over device seconds for all the row sets (the process's first device fit, and
    the warm one where it ran; a partial phase's total is its extrapolation): every core's (the
    row sets side by side) and one core's (`one_core_over_device`: each row set's own time, summed,
    what one CPU thread would take); and attention's if both finished."""
    cpu = phases["fit_cpu"]
    out: dict = {"status": "done"}
    for phase, name in (("fit_device", "cpu_over_device"), ("fit_device_again", "cpu_over_device_warm")):
        dev = phases.get(phase, {})
        if "all_row_sets_s" in cpu and "all_row_sets_s" in dev:
            out[name] = round(cpu["all_row_sets_s"] / max(dev["all_row_sets_s"], 1e-9), 2)
            out["extrapolated"] = out.get("extrapolated", False) or cpu["all_row_sets_extrapolated"] \
                or dev["all_row_sets_extrapolated"]
            if cpu.get("workers") and cpu.get("times"):  # one core's: each row set's own time, summed
                one_core = sum(cpu["times"].values()) * cpu["row_sets_total"] / len(cpu["times"])
                out[name.replace("cpu_", "one_core_")] = round(one_core / max(dev["all_row_sets_s"], 1e-9), 2)
    att_d, att_c = phases["attention_device"], phases["attention_cpu"]
    if att_d.get("status") == "done" and att_c.get("status") in ("done", "stopped"):
        c = att_c.get("seconds", att_c.get("seconds_at_least"))
        out["attention_cpu_over_device"] = round(c / max(att_d["seconds"], 1e-9), 2)
        out["attention_ratio_is_lower_bound"] = att_c["status"] == "stopped"
    if len(out) == 1:
        return {"status": "skipped", "reason": "no fit finished on both the device and the CPU"}
    return out


def summary_note(p: dict) -> str:
    if p.get("status") in ("skipped", "stopped") and "seconds_at_least" not in p:
        return f"{p['status']}: {p.get('reason', '')}"
    if "row_sets_done" in p:
        note = (f"{p['row_sets_done']}/{p['row_sets_total']} row sets in {p['seconds']} s "
                f"({p['per_row_set_s']} s each; all {p['all_row_sets_s']} s"
                + (", extrapolated)" if p["all_row_sets_extrapolated"] else ")"))
    elif "seconds_at_least" in p:
        note = f"> {p['seconds_at_least']} s (stopped)"
    elif "beta" in p:
        note = "; ".join(f"{spec} " + ", ".join(f"{f} {b}" for f, b in beta.items())
                         for spec, beta in p["beta"].items())
        if p.get("pixels_attention") is not None:
            note += f"; pixels attention {p['pixels_attention']}"
    else:
        note = f"{p['seconds']} s, β* {p.get('beta_star')}"
    if p.get("split", {}).get("stages_s"):
        note += f"; {split_note(p['split'])}"
    return note + (f"  [{p['reason']}]" if p.get("reason") else "")


def split_note(split: dict) -> str:
    """`split_of`'s reading in a line."""
    parts = [f"{k} {v} s" for k, v in split["stages_s"].items()]
    parts += [f"{k.replace('_stages_s', '')} stages {split[k]} s" for k in ("before_stages_s", "after_stages_s")]
    parts.append(f"gc {split['gc_s']} s ({split['gc_pauses']} pauses)")
    parts += [f"{k} +{split[k]}" for k in ALLOCATOR_COUNTS if split.get(k)]
    return "host s: " + ", ".join(parts)


def profile_note(p: dict) -> str:
    fits = [name for name in ("first", "warm") if name in p]
    if not fits:
        return f"{p['status']}: {p.get('reason', '')}"
    note = "; ".join(f"{name} fit {fit_note(p[name])}" for name in fits)
    if "first_less_warm" in p:
        d = p["first_less_warm"]
        stages = ", ".join(f"{k} {v['wall_s']:+} s" for k, v in d["stages"].items())
        calls = sorted(((v if isinstance(v, float) else v["host_s"], k) for k, v in d["runtime_host_s"].items()),
                       reverse=True)[:3]
        note += f"; first less warm: {d['wall_s']:+} s ({stages})" + (
            "; host s in runtime calls " + ", ".join(f"{k} {t:+}" for t, k in calls) if calls else "")
    return note + (f"  [{p['reason']}]" if p.get("reason") else "")


def fit_note(t: dict) -> str:
    """One profiled fit: wall, device busy in all and by stage, and what the device waited on."""
    stages = ", ".join(f"{k} {v['wall_s']} s ({v['busy_pct']} % busy)" for k, v in t["stages"].items())
    idle = t["idle"]
    return (f"{t['wall_s']} s, device busy {t['busy_pct']} %" + (f" ({stages})" if stages else "")
            + f", device idle {idle['seconds']} s, {idle['between_host_ops_s']} s of it in the host's Python"
            " between operations")


def sm_note(sm: dict) -> str:
    if sm["status"] != "done":
        return f"skipped: {sm['reason']}"
    parts = [f"{k} {w['mean_sm_pct']} %" for k, w in sm.items() if isinstance(w, dict) and "mean_sm_pct" in w]
    return f"{sm['mean_sm_pct']} % mean over {sm['samples']} s ({', '.join(parts)})"


def print_table(report: dict) -> None:
    p = report["phases"]
    c = report["config"]
    print(f"{MODEL} + {PIXELS} on {c['device_name']} ({c['cpu_threads']} CPU threads), small preset at "
          f"{c['image_size']} px, {c['n_train']}/{c['n_eval']}/{c['n_eval']} scenes, budget {c['budget']:.0f} s, "
          f"took {report['elapsed_s']} s")
    rows = [("generate", f"{p['generate']['seconds']} s")]
    for r in p["extract"]["runs"]:
        rows.append((f"extract {r['model']} {r['dtype']}", f"{r['seconds']} s" if "seconds" in r else "skipped"))
    rows += [(f"fit {c['families']} (device {c['device']})", summary_note(p["fit_device"])),
             (f"the same again, warm (device {c['device']})", summary_note(p["fit_device_again"])),
             (f"attention on pixels (device {c['device']})", summary_note(p["attention_device"])),
             ("SM utilisation while fitting", sm_note(p["sm_utilisation"])),
             ("β* (power)", summary_note(p["power"])),
             (f"fit {c['families']} (CPU path, row sets side by side)", summary_note(p["fit_cpu"])),
             ("attention on pixels (CPU path)", summary_note(p["attention_cpu"])),
             ("cpu / device", summary_note(p["ratio"]) if p["ratio"]["status"] == "skipped" else
              "; ".join(f"{k} {v}" for k, v in p["ratio"].items() if k != "status")),
             *([("profile of a fresh process's fits", profile_note(p["profile"]))] if "profile" in p else [])]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if report["skipped"]:
        print("cut for the budget: " + "; ".join(report["skipped"]))
