"""The raw limit of the text workload: the recipe's own operators, no loader around them.

A limit is only a bound if no arrangement of the same work a loader can use is
left out, and if it is timed only while all its cores work. So every
arrangement here runs the recipe's `Tokenize` (the same tokenizer, one text a
call in the calling thread, as zephon's workers call it), `MinTokens`, `Pack`
(best fit, its own open rows) and collate on documents parsed from JSONL
lines kept in memory (no file is read while timed, unlike any loader), and
it tries several arrangements; the text benchmark takes the best as the limit:

* ``{"processes": N}``: N forked processes (the parent's objects frozen for
  the garbage collector across the fork, as zephon forks its workers), each
  loading the tokenizer in its main thread and working from a side thread, as
  zephon's workers do (`zephon_core.internals.in_own_thread`);
  ``"start_method": "spawn"``: spawned ones, which load everything afresh;
* ``{"threads": N}``: N threads sharing the loaded tokenizer (it holds the
  GIL while it encodes: this arrangement shows what threads can reach).

The workers take the next `GROUP` documents from a shared counter, so none
runs out of work while another still has a share; each adds the rows it
collated to a shared count and all stop once `TextSpec.rows` rows are made.
A worker's partial batch at the stop is work no batch shows, so the events
are cut at the first worker's last batch: the rate is taken while every
worker ran. Documents run out only when asked for fewer than the rows need
(``"documents"``); the workers then flush their open rows, which makes every
document's tokens checkable against the loader's (``"check"``).
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import queue
import threading
import time
import traceback
import zlib
from typing import Any

#: documents per `Tokenize.process_many` call (zephon's default for small documents: 64;
#: 8, 32 and 128 cost the same CPU per token, measured: the tokenizer is nearly all of it)
GROUP = 32
#: seconds without a word from the workers before the run is given up as hung
WAIT_S = 900.0
now = time.monotonic


def run_limit(spec: Any, params: dict) -> dict:
    """The raw limit in the arrangement `params` names (module docstring)."""
    from zephon_bench.text_bench import SEQ_LEN, mixed_lines

    count = int(params.get("documents") or max(64, spec.rows * SEQ_LEN // 200))
    lines = mixed_lines(spec, count)
    check = bool(params.get("check"))
    if params.get("threads"):
        n = int(params["threads"])
        arrangement = f"{n} threads"
        per_worker, t_start = _run_threads(spec, lines, n, check)
    else:
        n = int(params.get("processes") or os.cpu_count() or 1)
        method = params.get("start_method", "fork")
        arrangement = f"{n} processes ({method})"
        per_worker, t_start = _run_processes(spec, lines, n, method, check)
    made = [w for w in per_worker if w["events"]]
    # while every worker ran: up to the first worker's last batch (all of them when the
    # documents ran out: then each flushed its rows, and the check wants every one)
    cut = min(w["events"][-1][0] for w in made) if made and not check else float("inf")
    events = sorted(e for w in made for e in w["events"] if e[0] <= cut)
    out = {"t_start": t_start, "events": events, "arrangement": arrangement, "workers": n,
           "rows_made": sum(e[1] for w in made for e in w["events"])}
    if check:
        out["documents"] = sorted(d for w in per_worker for d in w["documents"])
    return out


def document_checksums(arrays: dict, rows: list[list[tuple[int, int]]]) -> list[int]:
    """CRC-32 of each document's tokens in a collated batch: row i of ``arrays["input"]``
    holds the segments ``rows[i]`` (each ``(start, end)`` in its document) one after
    another from its first position, as `Pack`'s collate writes them. Order-free
    checks compare the sorted lists (zephon's `Loader.last_meta.rows` gives the same
    segments for the loader's batches)."""
    import numpy as np

    inp = np.asarray(arrays["input"])
    out = []
    for i, segments in enumerate(rows):
        at = 0
        for start, end in segments:
            out.append(zlib.crc32(inp[i, at:at + end - start].astype(np.int64).tobytes()))
            at += end - start
    return out


class _Shared:
    """The next document and the rows made, under one lock (a process-shared array's,
    or a thread lock): `claim` hands out the next group until the documents or the
    rows' quota run out."""

    def __init__(self, cells: Any, lock: Any, documents: int, quota: int) -> None:
        self.cells, self.lock, self.documents, self.quota = cells, lock, documents, quota

    def claim(self) -> int | None:
        with self.lock:
            g = self.cells[0]
            if g >= self.documents or self.cells[1] >= self.quota:
                return None
            self.cells[0] = g + GROUP
        return g

    def add_rows(self, n: int) -> None:
        with self.lock:
            self.cells[1] += n

    def stop(self) -> None:
        """No more claims: the run failed."""
        with self.lock:
            self.cells[1] = self.quota

    def exhausted(self) -> bool:
        with self.lock:
            return self.cells[0] >= self.documents and self.cells[1] < self.quota


def _produce(spec: Any, lines: list[tuple[int, bytes]], shared: _Shared, check: bool,
             ops: tuple, start: Any) -> dict:
    """One worker: wait for `start`, then tokenize, pack and collate claimed groups."""
    from zephon_bench.text_bench import BATCH_ROWS

    from zephon_core import Element, Origin

    recipe, tokenize, min_tokens, packer = ops
    events: list[list] = []
    docs: list[int] = []
    batch: list = []

    def emit() -> None:
        arrays = recipe.collate(batch)
        events.append([now(), len(batch), sum(r.num_tokens for r in batch)])
        if check:
            docs.extend(document_checksums(
                arrays, [[(s.start, s.end) for s in r.segments] for r in batch]))
        shared.add_rows(len(batch))
        batch.clear()

    def take_rows() -> None:
        while (row := packer.pop_row()) is not None:
            batch.append(row)
            if len(batch) == BATCH_ROWS:
                emit()

    start.wait()
    while (g := shared.claim()) is not None:
        part = lines[g:g + GROUP]
        got = tokenize.process_many([Element(g + j, json.loads(line))
                                     for j, (_, line) in enumerate(part)])
        got = min_tokens.process_many([Element(g + j, d) for j, d in enumerate(got)])
        for j, ((dataset, _), doc) in enumerate(zip(part, got, strict=True)):
            if isinstance(doc, dict):
                packer.push(Origin(g + j, dataset, 0, g + j, 0), doc)
            take_rows()
    if shared.exhausted():  # asked for fewer documents than the rows need: all of them
        packer.flush()
        take_rows()
        if batch:
            emit()
    return {"events": events, "documents": docs}


def _ops(spec: Any) -> tuple:
    """The recipe and its operators for one worker, the tokenizer loaded (before the
    clock starts, as in a loader's workers)."""
    from zephon_core import MinTokens, Pack, Tokenize

    recipe = spec.recipe()
    tokenize = next(op for op in recipe.ops if isinstance(op, Tokenize))
    min_tokens = next(op for op in recipe.ops if isinstance(op, MinTokens))
    packer = next(op for op in recipe.ops if isinstance(op, Pack)).make(0, spec.seed)
    tokenize.setup()
    return recipe, tokenize, min_tokens, packer


# --- threads ---------------------------------------------------------------------

def _run_threads(spec: Any, lines: list, n: int, check: bool) -> tuple[list[dict], float]:
    shared = _Shared([0, 0], threading.Lock(), len(lines), spec.rows)
    start, out = threading.Event(), queue.Queue()
    recipe = _ops(spec)  # one loaded tokenizer, shared; a packer per thread

    def worker(wid: int) -> None:
        try:
            ops = (*recipe[:3], _ops(spec)[3])
            out.put(("ready", wid, None))
            out.put(("done", wid, _produce(spec, lines, shared, check, ops, start)))
        except BaseException:  # noqa: BLE001 - the main thread raises it with its traceback
            out.put(("error", wid, traceback.format_exc()))

    threads = [threading.Thread(target=worker, args=(i,), daemon=True, name=f"text-limit-{i}")
               for i in range(n)]
    for t in threads:
        t.start()
    try:
        return _collect(out, n, start, lambda done: [], "thread")
    except BaseException:
        shared.stop()  # the other threads take no more documents
        raise
    finally:
        for t in threads:
            t.join(timeout=10)


# --- processes -------------------------------------------------------------------

def _process_main(spec: Any, lines: list | None, count: int, cells: Any, wid: int,
                  check: bool, start: Any, out: Any) -> None:
    """One process: the tokenizer loaded in its main thread, the work in a side thread
    (`zephon_core.internals.in_own_thread`: the faster arrangement)."""
    from zephon_core.internals import in_own_thread

    try:
        if lines is None:  # spawned: the documents are made here (deterministic)
            from zephon_bench.text_bench import mixed_lines

            lines = mixed_lines(spec, count)
        shared = _Shared(cells, cells.get_lock(), len(lines), spec.rows)
        ops = _ops(spec)
        out.put(("ready", wid, None))
        done: list[dict] = []
        in_own_thread(lambda: done.append(_produce(spec, lines, shared, check, ops, start)))
        out.put(("done", wid, done[0]))
    except BaseException:  # noqa: BLE001 - the main process raises it with its traceback
        out.put(("error", wid, traceback.format_exc()))


def _run_processes(spec: Any, lines: list, n: int, method: str,
                   check: bool) -> tuple[list[dict], float]:
    ctx = mp.get_context(method)
    cells, start, out = ctx.Array("q", 2), ctx.Event(), ctx.Queue()
    given = lines if method == "fork" else None
    procs = [ctx.Process(target=_process_main, daemon=True, name=f"text-limit-{i}",
                         args=(spec, given, len(lines), cells, i, check, start, out))
             for i in range(n)]
    if method == "fork":
        gc.freeze()  # the children's collections skip what they inherit (zephon does this)
    try:
        for p in procs:
            p.start()
    finally:
        if method == "fork":
            gc.unfreeze()

    def dead(done: set[int]) -> list[str]:
        # a second after the queue went quiet, a worker that ended sent all it will send
        return [f"{p.name} exit {p.exitcode}" for i, p in enumerate(procs)
                if p.exitcode is not None and i not in done]

    try:
        return _collect(out, n, start, dead, "process")
    except BaseException:
        for p in procs:  # the others would go on to the quota
            p.kill()
        raise
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def _collect(out: Any, n: int, start: Any, dead: Any, kind: str) -> tuple[list[dict], float]:
    """Wait for every worker to be ready, start the clock and them, and gather their
    results; a worker's error, or one that died or went silent, ends the run here."""
    ready, results, t_start, done = 0, [], None, set()
    waited = 0.0
    while len(results) < n:
        try:
            what, wid, payload = out.get(timeout=1.0)
        except queue.Empty:
            waited += 1.0
            if gone := dead(done):
                raise RuntimeError(f"text raw-limit {kind} died without a word: "
                                   + ", ".join(gone)) from None
            if waited > WAIT_S:
                raise RuntimeError(f"the text raw limit's workers ({kind}) sent nothing for "
                                   f"{WAIT_S:.0f} s ({len(results)} of {n} done)") from None
            continue
        waited = 0.0
        if what == "error":
            raise RuntimeError(f"text raw-limit {kind} {wid} failed:\n{payload}")
        if what == "ready":
            ready += 1
            if ready == n:
                t_start = now()
                start.set()
        else:
            results.append(payload)
            done.add(wid)
    return results, t_start
