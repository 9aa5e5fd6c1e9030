"""The text workload (``zephon-vl bench --workload text``): zephon-vl, its raw limit and the
original Zephon on text pre-training, tokens/s and rows/s, CPU per row and per token.

The pipeline (issue 39): JSONL documents of real text (:mod:`zephon_bench.text_data`),
the bundled Qwen tokenizer (EOS appended, text never becomes control tokens),
2048-token rows packed best fit into 4 open rows, 16 rows a step, 8 lanes,
shuffle on. Two scenarios: ``text`` (one dataset, prose) and ``text-mix`` (prose
and code mixed 0.7/0.3). Loaders:

* ``zephon-vl default``: ``for batch in Loader(text_recipe(...))``, `Execution()`;
* ``raw limit ...``: the recipe's own `Tokenize`, `MinTokens`, `Pack` and collate on the
  same documents in a tight loop, no loader, no transfer, in several arrangements
  (:mod:`zephon_bench.text_limit`: forked or spawned processes, threads); the best of
  them is the limit the ratios use;
* ``zephon 0.2.0 ...``: the original Zephon in its own virtual environment
  (:mod:`zephon_bench.text_peer`), threads or processes, ``--peer`` to leave it out.

Each run is a fresh process watched from outside (`TreeMonitor`); it stops after
``--rows`` rows. Rates are measured from 20% of the rows to the last (the raw limit's
last: its first worker's last batch, while all worked); CPU is the
whole process tree's (every worker's user + system time) over the same window, per
1,000 rows and per token. Runs of all loaders are interleaved over the repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCENARIOS = {"text": {"prose": 1.0}, "text-mix": {"prose": 0.7, "code": 0.3}}
SEQ_LEN, BATCH_ROWS, LANES, OPEN_ROWS = 2048, 16, 8, 4
WARM = 0.2
now = time.monotonic


@dataclass(frozen=True)
class TextSpec:
    """One scenario's data and settings: what every loader is given."""

    shards: dict[str, list[str]]
    weights: dict[str, float]
    tokenizer: str
    rows: int
    seed: int = 0

    def recipe(self) -> Any:
        from zephon_core import text_recipe

        return text_recipe({k: self.shards[k] for k in self.weights}, self.tokenizer,
                           seq_len=SEQ_LEN, global_batch_size=BATCH_ROWS, num_lanes=LANES,
                           weights=self.weights, seed=self.seed,
                           pack={"pack_mode": "best_fit", "max_open_bins": OPEN_ROWS})


def text_workloads(text: str) -> list[str]:
    """The text scenarios `--workload` names, [] when it names none; a mix of text and
    image workloads is refused (they have different loaders, settings and reports)."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    picked = [n for n in names if n in SCENARIOS]
    if picked and len(picked) != len(names):
        raise SystemExit("--workload: run the text workloads (text, text-mix) in a command "
                         "of their own")
    return picked


# --- the loaders, each in the child process of one run --------------------------------

def run_zephon(spec: TextSpec, params: dict) -> dict:
    """``for batch in Loader(recipe, 0, 1, execution)`` until `spec.rows` rows came."""
    from zephon_bench.text_limit import document_checksums

    from zephon_core import Execution, Loader

    t_start = now()
    loader = Loader(spec.recipe(), 0, 1, Execution.from_flat(dict(params.get("execution", {}))))
    events, rows, docs = [], 0, []
    try:
        for batch in loader:
            meta = loader.last_meta
            tokens = sum(e - s for row in meta.rows for _, s, e in row)
            rows += len(meta.rows)
            events.append([now(), len(meta.rows), tokens])
            if params.get("check"):  # each document's tokens, for the raw limit's test
                docs += document_checksums(batch, [[(s, e) for _, s, e in r] for r in meta.rows])
            if rows >= spec.rows:
                break
    finally:
        loader.close()
    return {"t_start": t_start, "events": events, **({"documents": docs} if docs else {})}


def mixed_lines(spec: TextSpec, count: int) -> list[tuple[int, bytes]]:
    """`count` (dataset, JSONL line) pairs, the datasets in the proportion of the weights."""
    names = list(spec.weights)
    lines = {n: [line for p in spec.shards[n] for line in open(p, "rb")] for n in names}
    total = sum(spec.weights.values())
    taken = dict.fromkeys(names, 0)
    out = []
    for i in range(count):
        # the dataset furthest behind its share (deterministic, no randomness needed)
        n = min(names, key=lambda k: (taken[k] - (i + 1) * spec.weights[k] / total, k))
        out.append((names.index(n), lines[n][taken[n] % len(lines[n])]))
        taken[n] += 1
    return out


def run_peer(spec: TextSpec, params: dict) -> dict:
    """The original Zephon (`text_peer`) in its own interpreter, `params` its settings."""
    from zephon_bench.text_peer import run_peer as run
    from zephon_bench.text_peer import split_special_copy

    from zephon_core import load_tokenizer

    work = Path(params["work"])
    job = {"datasets": {k: str(Path(spec.shards[k][0]).parent) for k in spec.weights},
           "weights": spec.weights, "rows": spec.rows, "seq_len": SEQ_LEN,
           "open_rows": OPEN_ROWS, "lanes": LANES, "rows_per_batch": BATCH_ROWS // LANES,
           "chunk_size": params.get("chunk_size", 64), "runner": params["runner"],
           "parallelism": params["parallelism"],
           "tokenizer": str(split_special_copy(Path(spec.tokenizer), work)),
           "eos": load_tokenizer(spec.tokenizer).eos_token_id}
    t_start = now()
    result = run(job, Path(params["python"]), work)
    return {**result, "t_start": t_start}


def run_limit(spec: TextSpec, params: dict) -> dict:
    """The raw limit in one arrangement (:mod:`zephon_bench.text_limit`)."""
    from zephon_bench.text_limit import run_limit as run

    return run(spec, params)


RUNNERS = {"zephon": run_zephon, "limit": run_limit, "peer": run_peer}


# --- one run: a forked child, its process tree watched from outside ---------------------

def child_run(cfg: dict, spec: TextSpec, result_path: Path) -> int:
    result = RUNNERS[cfg["family"]](spec, cfg["params"])
    result_path.write_text(json.dumps(result))
    return 0


def run_one(cfg: dict, spec: TextSpec, logdir: Path, tag: str, timeout: float) -> dict:
    """Run `cfg` in a forked child (its output in ``logdir/tag.log``); its metrics."""
    import psutil
    from zephon_bench.measure import TreeMonitor, fork_logged

    result_path, log_path = logdir / f"{tag}.json", logdir / f"{tag}.log"
    pid = fork_logged(log_path, lambda: child_run(cfg, spec, result_path))
    mon = TreeMonitor(pid)
    mon.start()
    deadline, status = now() + timeout, None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(st)
        elif now() > deadline:
            status = "timeout"
        else:
            time.sleep(0.05)
    mon.stop()
    for proc in _session(pid, psutil):
        proc.kill()
    if status == "timeout":
        os.waitpid(pid, 0)
    if status != 0 or not result_path.is_file():
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
        return {"ok": False, "error": f"exit {status}", "log_tail": tail}
    return {"ok": True, **metrics(json.loads(result_path.read_text()), mon.series)}


def _session(pid: int, psutil: Any) -> list:
    """The processes left in the run's session (the child called setsid)."""
    out = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and os.getsid(proc.pid) == pid:
                out.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def metrics(result: dict, series: Any) -> dict:
    """Steady rates (from `WARM` of the rows to the last batch) and the tree's CPU there."""
    from zephon_bench.measure import steady_window

    ev = result["events"]
    a, b = steady_window(ev, WARM, 1.0)
    ta, tb = ev[a][0], ev[b][0]
    dt = max(tb - ta, 1e-9)
    rows = sum(e[1] for e in ev[a + 1:b + 1])
    tokens = sum(e[2] for e in ev[a + 1:b + 1])
    cpu = series.at("tree_cpu", tb) - series.at("tree_cpu", ta)
    # the run's own process: zephon-vl's driver (its workers are children); the peer's is
    # a waiting parent, so its share is none there
    main = series.at("root_cpu", tb) - series.at("root_cpu", ta) if series.root_cpu else 0.0
    return {"rows_per_s": rows / dt, "tokens_per_s": tokens / dt,
            "cpu_s_per_1000_rows": 1000 * cpu / rows if rows else None,
            "cpu_us_per_token": 1e6 * cpu / tokens if tokens else None,
            "main_cpu_s_per_1000_rows": 1000 * main / rows if rows else None,
            "cores_used": cpu / dt, "ttfb_s": ev[0][0] - result["t_start"],
            "rows": sum(e[1] for e in ev), "tokens": sum(e[2] for e in ev),
            "steady_rows": rows, "steady_s": dt,
            "peak_pss_mb": max(series.tree_pss) / 2**20 if series.tree_pss else None}


# --- configurations, repetitions, the report --------------------------------------------

def configurations(quick: bool, ncpu: int, families: set[str], peer: dict | None) -> list[dict]:
    """zephon-vl's default (and, in a full run, its threads runner and 32 documents a
    group), the raw limit's arrangements, and the peer's threads and processes runners
    (`peer`: its interpreter and work folder; None leaves it out)."""
    cfgs = [{"name": "zephon-vl default", "family": "zephon", "params": {}}]
    cfgs += [{"name": f"raw limit {ncpu} {label}", "family": "limit", "params": params}
             for label, params in (("processes", {"processes": ncpu}),
                                   ("spawned processes",
                                    {"processes": ncpu, "start_method": "spawn"}),
                                   ("threads", {"threads": ncpu}))]
    if not quick:  # the tokenizer releases the GIL: threads share one loaded tokenizer
        # (one thread a stage unless told: as many as the processes of the default)
        cfgs.append({"name": f"zephon-vl threads x{ncpu}", "family": "zephon",
                     "params": {"execution": {"runner": "threads", "default_workers": ncpu}}})
        # the default sends these small documents up to 64 a call; groups of 8 (0.3's
        # default for every stage) show what that is worth, side by side
        cfgs.append({"name": "zephon-vl group_size 8", "family": "zephon",
                     "params": {"execution": {"group_size": 8}}})
    if peer is not None:
        runs = [("threads", ncpu)] if quick else \
            [("threads", ncpu), ("threads", 2), ("process", ncpu)]
        cfgs += [{"name": f"zephon 0.2.0 {r} x{n}", "family": "peer",
                  "params": {**peer, "runner": r, "parallelism": n}}
                 for r, n in dict.fromkeys(runs)]
    return [c for c in cfgs if c["family"] in families]


def summarize(runs: list[dict]) -> dict:
    """Medians over a configuration's successful runs."""
    ok = [r for r in runs if r["ok"]]
    keys = ("rows_per_s", "tokens_per_s", "cpu_s_per_1000_rows", "cpu_us_per_token",
            "main_cpu_s_per_1000_rows", "cores_used", "ttfb_s", "peak_pss_mb")
    return {k: statistics.median(v) if (v := [r[k] for r in ok if r.get(k) is not None])
            else None for k in keys} | {"runs": len(ok), "failed": len(runs) - len(ok)}


def _best(med: dict, prefix: str) -> tuple[str | None, float | None]:
    """The configuration named `prefix`... with the highest median tokens/s, and that rate."""
    rates = {k: v["tokens_per_s"] for k, v in med.items()
             if k.startswith(prefix) and v.get("tokens_per_s")}
    best = max(rates, key=rates.get) if rates else None
    return best, rates.get(best)


def ratios(scenario: dict) -> dict:
    """zephon-vl default against the raw limit (the best of its arrangements: `limit_best`)
    and the peer's best (tokens/s); `above_limit`: the loaders faster than that limit."""
    med = scenario["medians"]
    ours = (med.get("zephon-vl default") or {}).get("tokens_per_s")
    limit_name, limit = _best(med, "raw limit")
    best, peer = _best(med, "zephon 0.2.0")
    out = {"limit_best": limit_name, "peer_best": best}
    if ours and limit:
        out["default_to_limit"] = ours / limit
    if ours and peer:
        out["default_to_peer_best"] = ours / peer
    for k, v in med.items():
        if limit and (v.get("tokens_per_s") or 0.0) > limit and not k.startswith("raw limit"):
            out.setdefault("above_limit", []).append(k)
    return out


def markdown(report: dict) -> str:
    lines = []
    for name, sc in report["scenarios"].items():
        lines += [f"### {name} ({sc['label']}; {report['settings']['rows']} rows a run, "
                  f"medians of {report['settings']['reps']})", "",
                  "| loader | tokens/s | rows/s | CPU s / 1,000 rows | CPU us / token | "
                  "cores | first batch s |", "|---|---|---|---|---|---|---|"]
        for cfg, m in sc["medians"].items():
            def f(k: str, fmt: str, m: dict = m) -> str:
                return format(m[k], fmt) if m.get(k) is not None else "-"
            lines.append(f"| {cfg} | {f('tokens_per_s', ',.0f')} | {f('rows_per_s', '.1f')} | "
                         f"{f('cpu_s_per_1000_rows', '.2f')} | {f('cpu_us_per_token', '.2f')} | "
                         f"{f('cores_used', '.2f')} | {f('ttfb_s', '.2f')} |")
        r = sc["ratios"]
        lines += ["", ", ".join(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}"
                                for k, v in r.items()), ""]
    return "\n".join(lines)


def add_text_arguments(p: argparse.ArgumentParser) -> None:
    """The options only the text workload reads (`zephon-vl bench --workload text`)."""
    p.add_argument("--rows", type=int, default=None,
                   help="text workload: rows each run delivers (default 3000; quick 120)")
    p.add_argument("--no-peer", action="store_true",
                   help="text workload: leave out the original Zephon (no virtual environment)")
    p.add_argument("--peer-python", default=None, metavar="PATH",
                   help="text workload: the original Zephon's interpreter (default: a virtual "
                        "environment built once under zephon's cache; needs PyPI then)")


def _peer(args: argparse.Namespace, work: Path) -> dict | None:
    if args.no_peer or (args.only and "peer" not in args.only.split(",")):
        return None
    from zephon_bench.text_peer import peer_python

    python = Path(args.peer_python) if args.peer_python else peer_python()
    return {"python": str(python), "work": str(work)}


def run(args: argparse.Namespace) -> int:
    """The text workload: every configuration of every scenario, `reps` times, interleaved."""
    from zephon_bench.text_data import build_text_data

    from zephon_core import qwen_tokenizer_dir

    quick = args.quick
    reps = args.reps or (1 if quick else 3)
    data = build_text_data(args.samples or (1500 if quick else 30_000))
    rows = args.rows or (120 if quick else 3000)
    # absolute: the peer's driver runs in another folder and reads the paths it is given
    out = Path(args.out or "bench-out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="text-", dir=out))
    families = set(args.only.split(",")) if args.only else {"zephon", "limit", "peer"}
    ncpu = os.cpu_count() or 1
    cfgs = configurations(quick, ncpu, families, _peer(args, work))
    specs = {name: TextSpec({k: [str(p) for p in v] for k, v in data.shards.items()},
                            SCENARIOS[name], str(qwen_tokenizer_dir()), rows)
             for name in text_workloads(args.workload)}
    runs: dict[tuple[str, str], list[dict]] = {(s, c["name"]): [] for s in specs for c in cfgs}
    for rep in range(reps):
        for s, spec in specs.items():
            for cfg in cfgs[rep % len(cfgs):] + cfgs[:rep % len(cfgs)]:
                tag = f"r{rep}-{s}-" + "".join(ch if ch.isalnum() else "_" for ch in cfg["name"])
                r = run_one(cfg, spec, work, tag, args.timeout or (300 if quick else 1800))
                runs[(s, cfg["name"])].append(r)
                _say(f"  rep {rep} {s:8s} {cfg['name']:28s} " + (
                    f"{r['tokens_per_s']:10,.0f} tokens/s {r['rows_per_s']:7.1f} rows/s "
                    f"cpu {r['cpu_us_per_token']:.2f} us/token" if r["ok"]
                    else f"FAILED {r['error']}\n{r['log_tail']}"))
    report = {"format": "zephon-vl-bench-text", "version": 1,
              "settings": {"rows": rows, "reps": reps, "seq_len": SEQ_LEN,
                           "batch_rows": BATCH_ROWS, "lanes": LANES, "open_rows": OPEN_ROWS,
                           "documents": data.documents, "data": str(data.root), "cores": ncpu},
              "scenarios": {}}
    for s in specs:
        sc = {"label": " + ".join(f"{k} {w}" for k, w in SCENARIOS[s].items()),
              "medians": {c["name"]: summarize(runs[(s, c["name"])]) for c in cfgs},
              "runs": {c["name"]: runs[(s, c["name"])] for c in cfgs}}
        sc["ratios"] = ratios(sc)
        report["scenarios"][s] = sc
    text = json.dumps(report, indent=1, default=str)
    (out / "text-bench.json").write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    print(markdown(report))
    failed = any(not r["ok"] for rs in runs.values() for r in rs)
    return 3 if failed else 0


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zephon_bench.text_bench",
                                description=__doc__.split("\n")[0])
    p.add_argument("--workload", default="text,text-mix")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--samples", type=int, default=None,
                   help="documents in each dataset (default 30000; quick 1500)")
    p.add_argument("--only", default=None, help="comma-separated subset of zephon,limit,peer")
    p.add_argument("--out", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--timeout", type=float, default=None)
    add_text_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
