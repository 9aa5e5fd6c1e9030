"""The benchmark's markdown table and PNG chart, from its JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAMILY_NAMES = {"zephon": "zephon-vl", "grain": "Grain", "torch": "torch DataLoader",
                "spdl": "SPDL", "energon": "Megatron-Energon", "limit": "raw limit"}
COLORS = {"zephon": "#1f77b4", "grain": "#ff7f0e", "torch": "#2ca02c", "spdl": "#9467bd",
          "energon": "#8c564b", "limit": "#7f7f7f"}
HEADER = ("| loader | configuration | samples/s | / limit | tokens/s | images/s | first batch s "
          "| CPU ms/sample | main CPU ms/sample | cores used | peak PSS MB | peak shm MB "
          "| outside load | runs ok/disturbed |")
ALIGN = "| --- | --- |" + " ---: |" * 11 + " :---: |"


def _f(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def markdown(report: dict) -> str:
    m = report["machine"]
    s = report["settings"]
    lines = [
        f"zephon-vl bench ({report['mode']}), {report['date']}, {m['cpu_model']}, "
        f"{m['nproc']} cores; {s['samples']} samples ({s['images']} images), seq_len "
        f"{s['seq_len']}, {s['batch_rows']} rows/batch, max_pixels {s['max_pixels']}, "
        f"draft {s['draft']}, PIL {m['pillow_backend']}; medians of {report['reps']} rep(s).",
    ]
    e2e = report.get("e2e")
    if e2e:
        lines += ["", "Delivered training batches (collated, in the main process; pixels "
                  f"normalize={s.get('normalize', 'collate')}):", "", HEADER, ALIGN]
        lines += _rows(report["e2e_configs"], set(e2e["best"].values()))
        lines += ["", "| ratio (zephon **default**, delivered batches) | measured | target |",
                  "| --- | ---: | ---: |"]
        for key, label in (("ratio_vs_grain", "/ Grain best"),
                           ("ratio_vs_limit", "/ raw limit (with collate)"),
                           ("ratio_vs_torch", "/ torch DataLoader best"),
                           ("ratio_vs_spdl", "/ SPDL best"),
                           ("ratio_vs_energon", "/ Megatron-Energon best"),
                           ("e2e_over_worker_stage", "delivered / worker-stage rate"),
                           ("peak_pss_vs_grain", "peak PSS / Grain best's"),
                           ("cpu_per_sample_vs_grain", "CPU per sample / Grain best's"),
                           ("cpu_per_sample_vs_limit", "CPU per sample / raw limit's")):
            if key in e2e:
                target = e2e.get("targets", {}).get(key)
                op = "<=" if key == "peak_pss_vs_grain" else ">="
                passed = key == "ratio_vs_limit" and e2e.get("above_limit")
                lines.append(f"| `{key}` ({label}) | **{_f(e2e[key], 2)}**"
                             + (" (limit passed: see the warning)" if passed else "") + " | "
                             + (f"{op} {target}" if target else "") + " |")
    lines += workload_lines(report)
    if report.get("configs"):
        lines += ["", "Worker stage (processed documents reaching the main process; "
                  "packed there, no collate):", "", HEADER, ALIGN]
        lines += _rows(report["configs"], set(report["best"].values()))
        lines += ["", f"**ratio_vs_grain = {_f(report['ratio_vs_grain'], 2)}**, "
              f"**ratio_vs_limit = {_f(report['ratio_vs_limit'], 2)}**, "
              f"ratio_vs_torch = {_f(report.get('ratio_vs_torch'), 2)} "
              "(best samples/s over best samples/s; bold rows are each loader's best). "
              "CPU per sample of zephon's best: "
              f"{_f(report.get('cpu_per_sample_vs_grain'), 2)}x Grain's best, "
              f"{_f(report.get('cpu_per_sample_vs_limit'), 2)}x the raw limit's."]
    if report.get("scaling"):
        lines += ["", "Scaling (samples/s by worker processes):", "",
                  "| loader | " + " | ".join(str(n) for n in report["scaling"]["processes"])
                  + " |", "| --- |" + " ---: |" * len(report["scaling"]["processes"])]
        for fam, vals in report["scaling"]["samples_per_s"].items():
            lines.append(f"| {FAMILY_NAMES[fam]} | " + " | ".join(_f(v) for v in vals) + " |")
    if report.get("breakdown"):
        bd = report["breakdown"]
        lines += ["", f"Per-sample time by stage (one process, {bd['samples']} samples, "
                  f"{_f(bd['total_ms_per_sample'], 2)} ms/sample in all):", "",
                  "| stage | ms/sample | share |", "| --- | ---: | ---: |"]
        for k, v in bd["ms_per_sample"].items():
            lines.append(f"| {k} | {_f(v, 2)} | {_f(100 * bd['share'][k])}% |")
    if report.get("warnings"):
        lines += [""] + [f"- warning: {w}" for w in report["warnings"]]
    return "\n".join(lines) + "\n"


WORKLOAD_FAMILIES = ("grain", "torch", "spdl", "energon", "limit")


def workload_table(report: dict) -> list[str]:
    """One line per workload: zephon's default and each loader's best delivered samples/s
    (with the busy neighbour: and, in brackets, the share of the same loader's quiet
    rate), zephon's ratios, the highest zephon / Grain any loader running the same
    operators could reach (`ceiling_vs_grain`), first batch and peak PSS."""
    workloads = report.get("workloads") or {}
    rows = []
    for name, w in workloads.items():
        e = w.get("e2e")
        if not e:
            continue
        share = e.get("share_of_quiet") or {}
        med = {c["name"]: c["median"] for c in w["e2e_configs"]}
        z = med.get("zephon default", {})

        def cell(fam: str, rate: float | None, share: dict = share) -> str:
            return _f(rate) + (f" ({_f(share.get(fam), 2)})" if fam in share else "")

        def best(fam: str, key: str, e: dict = e, med: dict = med) -> float | None:
            n = e["best"].get(fam)
            return med.get(n, {}).get(key) if n else None

        rows.append(
            f"| {name} | {w['settings'].get('samples', '-')} "
            f"| {cell('zephon', e.get('zephon_default_samples_per_s'))} | "
            + " | ".join(cell(f, e["samples_per_s"].get(f)) for f in WORKLOAD_FAMILIES)
            + f" | {_f(e.get('ratio_vs_grain'), 2)} | {_f(e.get('ceiling_vs_grain'), 2)} "
            f"| {_f(e.get('ratio_vs_limit'), 2)}"
            + (" (limit passed)" if e.get("above_limit") else "") +
            f" | {_f(z.get('ttfb_s'), 2)} / {_f(best('torch', 'ttfb_s'), 2)} "
            f"| {_f(e.get('peak_pss_vs_grain'), 2)} "
            f"| {sum(c['runs_disturbed'] for c in w['e2e_configs'])}"
            f"/{sum(c['runs_ok'] + c['runs_disturbed'] for c in w['e2e_configs'])} |")
    if not rows:
        return []
    return ["| workload | samples | zephon default | Grain | torch DataLoader | SPDL "
            "| Megatron-Energon | raw limit | zephon / Grain | ceiling / Grain "
            "| zephon / limit | first batch s zephon / torch | PSS zephon / Grain "
            "| runs disturbed |",
            "| --- |" + " ---: |" * 13, *rows]


def workload_lines(report: dict) -> list[str]:
    """The workloads' table and, for each workload but the first, its full table."""
    workloads = report.get("workloads") or {}
    if not workloads or list(workloads) == ["photos"]:
        return []
    lines = ["", "Workloads (delivered samples/s: zephon's default and each loader's best; "
             "with +busy, in brackets: the share of its rate without the neighbour):", "",
             *workload_table(report)]
    first = report["settings"].get("workload", "photos")
    for name, w in workloads.items():
        if name == first or not w.get("e2e"):
            continue
        st = w["settings"]
        lines += ["", f"Workload `{name}` ({st.get('samples')} samples, seq_len "
                  f"{st.get('seq_len')}, {st.get('batch_rows')} rows/batch"
                  + (", a neighbour keeps one core busy" if w.get("busy_neighbour") else "")
                  + "):", "", HEADER, ALIGN]
        lines += _rows(w["e2e_configs"], set(w["e2e"]["best"].values()))
    return lines


def _rows(configs: list[dict], best: set[str]) -> list[str]:
    lines = []
    for c in configs:
        med = c["median"]
        name = f"**{c['name']}**" if c["name"] in best else c["name"]
        cpu, main = med.get("cpu_s_per_sample"), med.get("main_cpu_s_per_sample")
        lines.append(
            f"| {FAMILY_NAMES[c['family']]} | {name} | {_f(med.get('samples_per_s'))} "
            f"| {_vs_limit(c)} | {_f(med.get('tokens_per_s'), 0)} | {_f(med.get('images_per_s'))} "
            f"| {_f(med.get('ttfb_s'), 2)} | {_f(None if cpu is None else 1000 * cpu)} "
            f"| {_f(None if main is None else 1000 * main, 2)} "
            f"| {_f(med.get('cores_used'), 2)} | {_f(med.get('peak_mem_mb'), 0)} "
            f"| {_f(med.get('peak_shm_mb'), 0)} "
            f"| {_f(None if med.get('outside_load') is None else 100 * med['outside_load'], 0)}% "
            f"| {c['runs_ok']}/{c['runs_disturbed']} |")
    return lines


def _vs_limit(c: dict) -> str:
    """The rate over the raw limit's; **ABOVE** where a loader passed it (above_limit.py)."""
    return _f(c.get("vs_limit"), 2) + (" **ABOVE**" if c.get("above_limit") else "")


def e2e_chart(report: dict, path: str | Path) -> None:
    """Delivered samples/s, CPU ms per sample and peak PSS of every delivered-batch run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = [c for c in report["e2e_configs"] if c["median"]][::-1]
    fig, axes = plt.subplots(1, 3, figsize=(16, 1.4 + 0.4 * len(configs)),
                             gridspec_kw={"width_ratios": [3, 1.5, 1.5]}, squeeze=False)
    colors = [COLORS[c["family"]] for c in configs]
    for ax, key, label, scale, fmt in (
            (axes[0][0], "samples_per_s", "delivered samples/s (collated batches, median)", 1,
             "{:.0f}"),
            (axes[0][1], "cpu_s_per_sample", "CPU ms per sample (process tree)", 1000, "{:.1f}"),
            (axes[0][2], "peak_mem_mb", "peak PSS of the process tree, MB", 1, "{:.0f}")):
        _bars(ax, configs, key, scale, fmt, colors, ax is axes[0][0])
        ax.set_xlabel(label, fontsize=9)
        ax.margins(x=0.2)
    e = report["e2e"]
    m = report["machine"]
    parts = [f"{e[k]:.2f}x {label}" for k, label in (
        ("ratio_vs_grain", "Grain"), ("ratio_vs_energon", "Energon"),
        ("ratio_vs_limit", "raw limit"), ("e2e_over_worker_stage", "its worker stage"))
        if e.get(k)]  # only the loaders this run measured
    axes[0][0].set_title(
        f"delivered batches, {report['date'][:10]}, {m['nproc']} cores: zephon default "
        + ", ".join(parts), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def workloads_chart(report: dict, path: str | Path) -> None:
    """Per workload, zephon's default and each loader's best delivered rate over Grain's
    best, the 1.3x target, and the ceiling: zephon's rate on the cores it used at the raw
    limit's CPU per sample (`ceiling_vs_grain`), which no loader running the same
    operators can pass."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(n, w["e2e"]) for n, w in (report.get("workloads") or {}).items()
            if w.get("e2e") and w["e2e"]["samples_per_s"].get("grain")]
    fams = [f for f in FAMILY_NAMES if any(e["samples_per_s"].get(f) for _, e in rows)]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.9 * len(rows)))
    height = 0.8 / max(len(fams), 1)
    for i, (_, e) in enumerate(rows):
        grain = e["samples_per_s"]["grain"]
        for j, fam in enumerate(fams):
            rate = (e.get("zephon_default_samples_per_s") if fam == "zephon"
                    else e["samples_per_s"].get(fam))
            if rate:
                y = i + (j - (len(fams) - 1) / 2) * height
                ax.barh(y, rate / grain, height, color=COLORS[fam],
                        label=FAMILY_NAMES[fam] if i == 0 else None)
                ax.text(rate / grain, y, f" {rate / grain:.2f}", va="center", fontsize=7)
        if e.get("ceiling_vs_grain"):
            ax.plot([e["ceiling_vs_grain"]] * 2, [i - 0.45, i + 0.45], color="black", lw=2,
                    label="ceiling: zephon's cores at the raw limit's CPU/sample"
                    if i == 0 else None)
    ax.axvline(1.3, color="red", ls="--", lw=1, label="target 1.3x Grain")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([n for n, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("delivered samples/s over Grain's best (median)", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"workloads, {report['date'][:10]}, {report['machine']['nproc']} cores",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(ax: Any, configs: list[dict], key: str, scale: float, fmt: str, colors: list,
          named: bool) -> None:
    """One horizontal bar per configuration (its median `key` x `scale`, written beside
    it; hatched when no run was undisturbed), names on the y axis when `named`."""
    vals = [(c["median"].get(key) or 0) * scale for c in configs]
    bars = ax.barh(range(len(configs)), vals, color=colors)
    for bar, c, v in zip(bars, configs, vals, strict=True):
        if c["runs_ok"] == 0:
            bar.set_hatch("//")
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + fmt.format(v),
                va="center", fontsize=7)
    ax.set_yticks(range(len(configs)))
    ax.set_yticklabels([c["name"] for c in configs] if named else [], fontsize=8)


def chart(report: dict, path: str | Path) -> None:
    """Samples/s and CPU ms per sample of every configuration, and the scaling curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = [c for c in report["configs"] if c["median"]][::-1]
    has_scaling = bool(report.get("scaling"))
    ncols = 3 if has_scaling else 2
    fig, axes = plt.subplots(1, ncols, figsize=(5.2 * ncols + 3, 1.2 + 0.36 * len(configs)),
                             gridspec_kw={"width_ratios": [3, 1.6, 2][:ncols]}, squeeze=False)
    colors = [COLORS[c["family"]] for c in configs]
    m = report["machine"]
    for ax, key, label, scale, fmt in (
            (axes[0][0], "samples_per_s", "samples/s (steady state, median)", 1, "{:.0f}"),
            (axes[0][1], "cpu_s_per_sample", "CPU ms per sample (whole process tree)", 1000,
             "{:.1f}")):
        _bars(ax, configs, key, scale, fmt, colors, ax is axes[0][0])
        ax.set_xlabel(label, fontsize=9)
        ax.margins(x=0.18)
    gr = report.get("ratio_vs_grain")
    lim = report.get("ratio_vs_limit")
    axes[0][0].set_title(f"zephon-vl bench, {report['date'][:10]}, {m['nproc']} cores "
                         f"({m['cpu_model']}): vs Grain {gr or 0:.2f}x, vs limit {lim or 0:.2f}x"
                         "; hatched: every run disturbed", fontsize=9)
    if has_scaling:
        ax2 = axes[0][2]
        sc = report["scaling"]
        for fam, ys in sc["samples_per_s"].items():
            pts = [(n, y) for n, y in zip(sc["processes"], ys, strict=True) if y is not None]
            if pts:
                ax2.plot(*zip(*pts, strict=True), marker="o", color=COLORS[fam],
                         label=FAMILY_NAMES[fam])
        ax2.set_xlabel("worker processes", fontsize=9)
        ax2.set_ylabel("samples/s", fontsize=9)
        ax2.set_xticks(sc["processes"])
        ax2.set_title("scaling", fontsize=9)
        ax2.legend(fontsize=8)
        ax2.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
