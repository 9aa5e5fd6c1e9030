"""The benchmark's markdown table and PNG chart, from its JSON."""

from __future__ import annotations

from pathlib import Path

FAMILY_NAMES = {"zephon": "zephon-vl", "grain": "Grain", "torch": "torch DataLoader",
                "limit": "raw limit"}
COLORS = {"zephon": "#1f77b4", "grain": "#ff7f0e", "torch": "#2ca02c", "limit": "#7f7f7f"}


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
        "",
        "| loader | configuration | samples/s | tokens/s | images/s | first batch s "
        "| CPU ms/sample | cores used | peak RSS MB | outside load | runs ok/disturbed |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    best = {v for v in report["best"].values()}
    for c in report["configs"]:
        if c.get("scaling_only"):
            continue
        med = c["median"]
        name = f"**{c['name']}**" if c["name"] in best else c["name"]
        cpu = med.get("cpu_s_per_sample")
        lines.append(
            f"| {FAMILY_NAMES[c['family']]} | {name} | {_f(med.get('samples_per_s'))} "
            f"| {_f(med.get('tokens_per_s'), 0)} | {_f(med.get('images_per_s'))} "
            f"| {_f(med.get('ttfb_s'), 2)} | {_f(None if cpu is None else 1000 * cpu)} "
            f"| {_f(med.get('cores_used'), 2)} | {_f(med.get('peak_rss_mb'), 0)} "
            f"| {_f(None if med.get('outside_load') is None else 100 * med['outside_load'], 0)}% "
            f"| {c['runs_ok']}/{c['runs_disturbed']} |")
    lines += ["", f"**ratio_vs_grain = {_f(report['ratio_vs_grain'], 2)}**, "
              f"**ratio_vs_limit = {_f(report['ratio_vs_limit'], 2)}**, "
              f"ratio_vs_torch = {_f(report.get('ratio_vs_torch'), 2)} "
              "(best samples/s over best samples/s; bold rows are each loader's best)."]
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


def chart(report: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = [c for c in report["configs"] if not c.get("scaling_only")]
    has_scaling = bool(report.get("scaling"))
    fig, axes = plt.subplots(1, 2 if has_scaling else 1, figsize=(13 if has_scaling else 8, 0.9
                             + 0.38 * len(configs)), gridspec_kw={"width_ratios": [3, 2]}
                             if has_scaling else None, squeeze=False)
    ax = axes[0][0]
    names = [c["name"] for c in configs][::-1]
    vals = [c["median"].get("samples_per_s") or 0 for c in configs][::-1]
    colors = [COLORS[c["family"]] for c in configs][::-1]
    bars = ax.barh(names, vals, color=colors)
    for bar, c in zip(bars, configs[::-1], strict=True):
        if c["runs_ok"] == 0:
            bar.set_hatch("//")
    for bar, v in zip(bars, vals, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v:.1f}",
                va="center", fontsize=8)
    ax.set_xlabel("samples/s (steady state, median)")
    m = report["machine"]
    ax.set_title(f"{report['date'][:10]}, {m['nproc']} cores: vs Grain "
                 f"{report['ratio_vs_grain']:.2f}x, vs limit {report['ratio_vs_limit']:.2f}x",
                 fontsize=10)
    ax.margins(x=0.15)
    if has_scaling:
        ax2 = axes[0][1]
        sc = report["scaling"]
        for fam, ys in sc["samples_per_s"].items():
            pts = [(n, y) for n, y in zip(sc["processes"], ys, strict=True) if y is not None]
            if pts:
                ax2.plot(*zip(*pts, strict=True), marker="o", color=COLORS[fam],
                         label=FAMILY_NAMES[fam])
        ax2.set_xlabel("worker processes")
        ax2.set_ylabel("samples/s")
        ax2.set_xticks(sc["processes"])
        ax2.set_title("scaling", fontsize=10)
        ax2.legend(fontsize=8)
        ax2.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
