"""Saying so when a loader passes the raw limit (issue 39).

The raw limit is the recipe's work with no loader around it
(:mod:`zephon_bench.raw_limit`), so a loader measured above it has not done
less work: the measurement, or the limit, is off. Two causes are known. A
loader that holds finished documents (zephon's lanes) delivers them in a burst
after its first batch; with few passes over the data that burst falls inside
the steady window, and the loader's rate and CPU per sample in the window
count samples made before it (its CPU per sample comes out *below* the
limit's, which runs the same operators). Otherwise the limit's arrangements
missed one that suits the workload. Either way a ratio to that limit says
little, and the report says so: each configuration's ``vs_limit`` and
``above_limit``, the block's ``above_limit`` names and a warning line.
"""

from __future__ import annotations

from typing import Any


def mark_above_limit(configs: list[dict], limit_name: str | None) -> list[str]:
    """Set each configuration's ``vs_limit`` (median samples/s over the limit's best) and
    ``above_limit``; return the names of the loaders' configurations above the limit."""
    limit = next((c for c in configs if c["name"] == limit_name), None)
    rate = (limit or {}).get("median", {}).get("samples_per_s")
    above = []
    for c in configs:
        own = (c.get("median") or {}).get("samples_per_s")
        c["vs_limit"] = own / rate if own and rate else None
        c["above_limit"] = c["family"] != "limit" and (c["vs_limit"] or 0.0) > 1.0
        if c["above_limit"]:
            above.append(c["name"])
    return above


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.1f}"


def above_limit_warning(scope: str, configs: list[dict], limit_name: str | None) -> str | None:
    """One warning line for the configurations `mark_above_limit` flagged, or None."""
    flagged = [c for c in configs if c.get("above_limit")]
    limit = next((c for c in configs if c["name"] == limit_name), None)
    if not flagged or limit is None:
        return None
    lm = limit["median"]
    parts = []
    for c in flagged:
        m = c["median"]
        detail = f"CPU {_ms(m.get('cpu_s_per_sample'))} ms/sample in the window"
        if m.get("stage_samples_per_s"):
            detail = f"worker stage {m['stage_samples_per_s']:.1f}, " + detail
        parts.append(f"{c['name']} {m['samples_per_s']:.1f} samples/s ({c['vs_limit']:.2f}x; "
                     f"{detail})")
    burst = any(_less(c["median"].get("cpu_s_per_sample"), lm.get("cpu_s_per_sample"))
                for c in flagged)
    cause = ("less CPU per sample than the limit, which runs the same operators: samples "
             "made before the steady window were delivered in it (a burst after the first "
             "batch; run more --e2e-epochs)" if burst else
             "the run-to-run spread (compare repeated runs), or the limit's arrangements "
             "missed one that suits this workload")
    return (f"{scope}: the raw limit ({limit_name}, {lm['samples_per_s']:.1f} samples/s, CPU "
            f"{_ms(lm.get('cpu_s_per_sample'))} ms/sample) was passed by " + "; ".join(parts)
            + f". Ratios to the limit say little here; likely cause: {cause}.")


#: CPU per sample in the window below this share of the limit's: work done before the window
BURST_CPU_SHARE = 0.9


def _less(x: float | None, y: float | None) -> bool:
    return x is not None and y is not None and x < BURST_CPU_SHARE * y


def limit_warnings(report: dict[str, Any]) -> list[str]:
    """The warning lines of every block of a summarized report (worker stage, delivered
    batches of each workload) in which a loader passed the raw limit."""
    out = []
    if report.get("above_limit"):
        out.append(above_limit_warning("worker stage", report["configs"],
                                       report["best"].get("limit")))
    workloads = report.get("workloads") or {}
    blocks = ([(f"workload {n}", w) for n, w in workloads.items()] if workloads
              else [("delivered batches", report)])
    for scope, block in blocks:
        e = block.get("e2e")
        if e and e.get("above_limit"):
            out.append(above_limit_warning(scope, block["e2e_configs"], e["best"].get("limit")))
    return [w for w in out if w]
