"""One leaf walk for the shared-memory transport and the backlog (issue 22): the leaves the
backlog counts are the leaves the transport moves, in the same order."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import numpy as np

from zephon_core.common.leaves import iter_leaves, map_leaves


@dataclasses.dataclass(frozen=True)
class Patches:
    pixels: np.ndarray
    grid: tuple[int, int, int]
    cache: object = dataclasses.field(default=None, init=False)


class Pair(NamedTuple):
    left: np.ndarray
    right: list


def is_array(obj: object) -> bool:
    return isinstance(obj, np.ndarray)


def payload() -> dict:
    a, b, c, d = (np.full(3, i) for i in range(4))
    return {"tokens": [1, 2, 3], "image": Patches(a, (1, 2, 2)),
            "pair": Pair(b, [c, "text", None]), "more": (d, {"x": 1.5}),
            "opaque": {frozenset({1})}}


def test_iter_gives_the_leaves_map_rebuilds_in_order() -> None:
    seen = [int(a[0]) for a in iter_leaves(payload(), is_array)]
    order: list[int] = []
    out = map_leaves(payload(), is_array, lambda a: order.append(int(a[0])) or a * 10)
    assert seen == order == [0, 1, 2, 3]
    assert isinstance(out["image"], Patches) and out["image"].grid == (1, 2, 2)
    assert isinstance(out["pair"], Pair) and out["pair"].right[1:] == ["text", None]
    assert [int(a[0]) for a in iter_leaves(out, is_array)] == [0, 10, 20, 30]
    assert out["tokens"] == [1, 2, 3] and out["opaque"] == {frozenset({1})}


def test_plain_types_are_never_entered() -> None:
    p = Pair(np.zeros(2), [])
    assert list(iter_leaves({"p": p}, is_array, plain={Pair})) == []
    assert map_leaves(p, is_array, lambda a: None, plain={Pair}) is p


@dataclasses.dataclass(frozen=True)
class Checked:
    """A settings-like record whose construction is counted (validation in __post_init__)."""

    name: str
    built: list = dataclasses.field(default_factory=list, compare=False)

    def __post_init__(self) -> None:
        self.built.append(self.name)


def test_containers_without_a_changed_leaf_are_kept_not_rebuilt() -> None:
    """The transport walks every message; rebuilding a record that holds no array (an
    image's settings beside its bytes) ran its validation once per item per message."""
    built: list = []
    settings = Checked("image", built)
    built.clear()
    small = np.zeros(2)
    msg = {"items": [Pair(small, [settings]), (settings, 3)], "meta": Patches(small, (1, 1, 1))}
    out = map_leaves(msg, is_array, lambda a: a)  # every leaf handed back as it is
    assert out is msg and built == []
    swapped = map_leaves(msg, is_array, lambda a: a + 1)
    assert swapped is not msg and swapped["items"][0].right[0] is settings and built == []
    assert swapped["items"][1] is msg["items"][1]  # a tuple without a leaf is kept
    assert int(swapped["meta"].pixels[0]) == 1 and msg["meta"].pixels[0] == 0


@dataclasses.dataclass(frozen=True)
class Planned:
    """A record that names where its arrays are: `settings` is never entered."""

    leaf_fields: ClassVar[tuple[str, ...]] = ("data",)
    data: np.ndarray
    settings: Checked


def test_a_record_naming_its_leaf_fields_is_entered_only_there() -> None:
    built: list = []
    settings = Checked("image", built)
    built.clear()
    p = Planned(np.zeros(3), settings)
    hidden = Planned(np.zeros(3), Checked("x", [np.zeros(8)]))  # an array where none is named
    assert [a.shape for a in iter_leaves([p, hidden], is_array)] == [(3,), (3,)]
    out = map_leaves(p, is_array, lambda a: a + 1)
    assert out.settings is settings and built == [] and out.data[0] == 1
