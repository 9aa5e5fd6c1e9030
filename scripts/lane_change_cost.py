"""What a lane-count change on resume holds and costs, after K steps of text-demo.

`python scripts/lane_change_cost.py` prints, for 8 -> 16 and 16 -> 8 lanes and
K = 4, 40, 200: the old and new state sizes, the samples the old lanes held,
the rows, carried samples and holes of the new state, and the time of
`change_lanes` and of the restore (docs/elastic-changes.md).
"""

from __future__ import annotations

import json
import time

from zephon_core import Execution, Loader, change_lanes, load_recipe
from zephon_core.internals import combiner_state

INLINE = Execution(runner="inline")


def main() -> None:
    for L, L2 in ((8, 16), (16, 8)):
        for K in (4, 40, 200):
            with Loader(load_recipe("text-demo", num_lanes=L), 0, 1, INLINE) as ld:
                for _ in range(K):
                    ld.next_rows()
                state = json.loads(json.dumps(ld.state_dict()))
            held = sum(len(o) for snap in state["lanes"].values()
                       for o in snap["pending"].values())
            held += sum(len(a["buffer"]) for snap in state["lanes"].values()
                        for a in snap["accumulators"].values())
            t0 = time.perf_counter()
            new = change_lanes(state, load_recipe("text-demo", num_lanes=L2))
            t_change = time.perf_counter() - t0
            rls = [s["source"]["relaned"] for s in new["lanes"].values()]
            carried = sum(len(r["carry"]) for r in rls)
            holes = sum(len(e) for r in rls for e in r["explicit"])
            rows = sum(len(combiner_state(s)["ready"]) for s in new["lanes"].values())
            with Loader(load_recipe("text-demo", num_lanes=L2), 0, 1, INLINE) as ld:
                t0 = time.perf_counter()
                ld.load_state_dict(new)
                t_restore = time.perf_counter() - t0
            print(f"L={L}->{L2} K={K}: old state {len(json.dumps(state))} B, held {held}; new "
                  f"state {len(json.dumps(new))} B, rows {rows}, carried {carried}, holes "
                  f"{holes}; change_lanes {t_change * 1000:.1f} ms, restore "
                  f"{t_restore * 1000:.0f} ms")


if __name__ == "__main__":
    main()
