"""Users' own operators in a text recipe (docs/operators.md): random maps and filters give
the same batches at every D, runner and resume; drops carry the user's reason in the
ledger; recipe files name operators by import path; a changed operator refuses an old
checkpoint, naming it; bad ``[[operators]]`` tables are refused naming the key."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.helpers import user_ops
from zephon_core import (
    CheckpointError,
    ConfigError,
    Execution,
    Loader,
    UnknownKeyError,
    UserOp,
    batch_digest,
    load_recipe,
    run_digests,
    text_recipe,
    user_rng,
)

INLINE = Execution(runner="inline", group_size=3, prefetch=2, prefetch_steps=0)
STEPS = 3
CUT = UserOp("tests.helpers.user_ops:cut", after="read", args={"keep": 0.3}, version="1")
NO_SEVENS = UserOp(user_ops.no_sevens, kind="filter", reason="has_seven")


def _data(folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for f in range(2):
        path = folder / f"part-{f}.jsonl"
        path.write_text("".join(
            json.dumps({"text": f"document {f * 40 + i} " + "word " * (5 + (i * 7) % 23)}) + "\n"
            for i in range(40)))
        files.append(str(path))
    return files


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return _data(tmp_path_factory.mktemp("user-ops"))


def _recipe(files: list[str], operators=(CUT, NO_SEVENS), **kw):
    return text_recipe(files, None, seq_len=64, global_batch_size=8, num_lanes=4,
                       shuffle_buffer=8, operators=list(operators), **kw)


def _digests(files: list[str], D: int, ex: Execution = INLINE, **kw) -> list[str]:
    return [r.sha256 for r in run_digests(lambda: _recipe(files, **kw), D, STEPS, ex)]


def test_user_ops_go_where_they_say_and_are_in_the_fingerprint(files) -> None:
    recipe = _recipe(files)
    assert [o.name for o in recipe.ops] == ["shuffle", "read", "cut", "no_sevens", "tokenize",
                                            "min_tokens", "pack"]
    ops = {o["name"]: o for o in recipe.fingerprint()["operators"]}
    assert ops["cut"] == {"name": "cut", "type": "UserTransform",
                          "call": "tests.helpers.user_ops:cut", "kind": "map", "after": "read",
                          "args": {"keep": 0.3}, "version": "1"}
    assert ops["no_sevens"]["call"] == "tests.helpers.user_ops:no_sevens"
    assert ops["no_sevens"]["reason"] == "has_seven"
    after_tokenize = UserOp(user_ops.cut, after="tokenize", name="late")
    names = [o.name for o in _recipe(files, operators=[after_tokenize]).ops]
    assert names.index("late") == names.index("tokenize") + 1
    with pytest.raises(ConfigError, match="'pixels' is not a point of a text recipe"):
        _recipe(files, operators=[UserOp(user_ops.cut, after="pixels")])


def test_user_rng_depends_on_the_sample_and_the_operator_only() -> None:
    a, b = user_rng(12345, "cut").random(4), user_rng(12345, "cut").random(4)
    assert (a == b).all()
    assert not (a == user_rng(12345, "crop").random(4)).any()
    assert not (a == user_rng(12346, "cut").random(4)).any()
    assert not (a == user_rng(12345, "cut", part=1).random(4)).any()


def test_random_user_ops_same_batches_at_every_D_and_runner(files) -> None:
    ref = _digests(files, 1)
    plain = _digests(files, 1, operators=())
    assert ref != plain  # the operators changed the data
    assert _digests(files, 2) == ref
    assert _digests(files, 4) == ref
    threads = Execution(runner="threads", default_workers=2, group_size=2, prefetch=3,
                        prefetch_steps=0)
    assert _digests(files, 2, threads) == ref


@pytest.mark.slow
def test_random_user_ops_same_batches_in_worker_processes(files) -> None:
    ex = Execution(runner="auto", default_workers=2, group_size=4, prefetch=2,
                   prefetch_steps=0)
    with Loader(_recipe(files), 0, 1, ex) as loader:
        stages = {s.name: s.runner_kind for s in loader.plan.stages if s.kind == "transform"}
        assert stages["read+cut+no_sevens+tokenize+min_tokens"] == "processes", stages
        got = [batch_digest(next(loader)) for _ in range(STEPS)]
    assert got == _digests(files, 1)


def test_resume_on_another_D_repeats_the_random_batches(files) -> None:
    recs = list(run_digests(lambda: _recipe(files), 2, STEPS, INLINE, save_at=1,
                            resume_dp=[4, 1]))
    run = [r.sha256 for r in recs if r.phase == "run"]
    resumed = [r.sha256 for r in recs if r.phase == "resumed@1"]
    assert run == _digests(files, 1)
    assert resumed == run[1:] * 2


def _ledger_drops(path: Path) -> list[tuple]:
    out = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        out += [(d["lane"], d["dataset"], d["shard"], d["index"], d["epoch"], d["reason"])
                for d in entry.get("drops", ())]
    return out


def test_filter_drops_are_in_the_ledger_with_the_users_reason(files, tmp_path) -> None:
    drops = {}
    for D in (1, 2):
        path = tmp_path / f"ledger-{D}.jsonl"
        list(run_digests(lambda: _recipe(files), D, STEPS, INLINE, ledger=path))
        drops[D] = _ledger_drops(path)
    assert drops[1] == drops[2]
    assert drops[1] and {d[-1] for d in drops[1]} == {"has_seven"}, drops[1]
    recipe = _recipe(files)
    for _, ds, shard, index, _, _ in drops[1]:  # each one holds a 7
        record = recipe.datasets[ds].reader.read(shard, index)
        assert "7" in record["text"], record


def test_a_changed_operator_refuses_the_old_checkpoint_naming_it(files) -> None:
    states: list[str] = []
    list(run_digests(lambda: _recipe(files), 1, 2, INLINE, save_at=1, resume_dp=[],
                     on_state=states.append))
    state = json.loads(states[0])
    bumped = UserOp(CUT.fn, after="read", args={"keep": 0.3}, version="2")
    other_args = UserOp(CUT.fn, after="read", args={"keep": 0.4}, version="1")
    for op, field in ((bumped, "version"), (other_args, "args.keep")):
        with Loader(_recipe(files, operators=[op, NO_SEVENS]), 0, 1, INLINE) as loader, \
                pytest.raises(CheckpointError, match=rf"operators\[2\]\.{field} \(cut\)"):
            loader.load_state_dict(state)
    with Loader(_recipe(files), 0, 1, INLINE) as loader:
        loader.load_state_dict(state)  # the same operators restore


def test_a_local_function_runs_in_the_driver_and_is_refused_for_processes(files) -> None:
    def cut_here(record, *, rng, keep=0.5):
        return user_ops.cut(record, rng=rng, keep=keep)

    local = UserOp(cut_here, args={"keep": 0.3}, name="cut")
    recipe = _recipe(files, operators=[local, NO_SEVENS])
    assert recipe.fingerprint()["operators"][2]["call"].endswith("<locals>.cut_here")
    auto = Execution(group_size=3, prefetch=2, prefetch_steps=0)  # auto: the driver runs it
    with Loader(recipe, 0, 1, auto) as loader:
        got = [batch_digest(next(loader)) for _ in range(STEPS)]
    assert got == _digests(files, 1)  # same batches as the importable function
    threads = Execution(runner="threads", default_workers=2, group_size=2, prefetch_steps=0)
    assert [r.sha256 for r in run_digests(lambda: recipe, 2, STEPS, threads)] == got
    assert copy.deepcopy(recipe).ops[2].fn is cut_here  # a copy is no pickle
    procs = Execution(runner="processes", default_workers=1)
    with pytest.raises(ConfigError, match=r"operator 'cut' wraps .*cut_here.*module level"):
        with Loader(_recipe(files, operators=[local]), 0, 1, procs) as loader:
            next(loader)


def test_a_filter_that_returns_no_bool_stops_the_run(files) -> None:
    recipe = _recipe(files, operators=[UserOp(user_ops.say, kind="filter")])
    with pytest.raises(ConfigError, match="filter 'say' returned str"):
        with Loader(recipe, 0, 1, INLINE) as loader:
            next(loader)


def _toml(tmp_path: Path, files: list[str], operators: str) -> Path:
    path = tmp_path / "user.toml"
    path.write_text(f"""kind = "text"
seq_len = 64
global_batch_size = 8
num_lanes = 4
shuffle_buffer = 8
[[datasets]]
name = "data"
files = {json.dumps(files)}
{operators}""")
    return path


TOML_OPS = """[[operators]]
call = "tests.helpers.user_ops:cut"
after = "read"
args = { keep = 0.3 }
version = "1"
[[operators]]
call = "tests.helpers.user_ops:no_sevens"
kind = "filter"
reason = "has_seven"
"""


def test_a_recipe_file_names_operators_by_import_path(files, tmp_path) -> None:
    recipe = load_recipe(_toml(tmp_path, files, TOML_OPS))
    python = _recipe(files)
    assert recipe.fingerprint()["operators"] == python.fingerprint()["operators"]
    with Loader(recipe, 0, 1, INLINE) as loader:
        got = [batch_digest(next(loader)) for _ in range(STEPS)]
    assert got == _digests(files, 1)


@pytest.mark.parametrize(("table", "message"), [
    ('call = "tests.helpers.user_ops:cut"\ncolour = "red"', r"unknown key 'colour' in "
     r"\[\[operators\]\] #1"),
    ('call = "no_such_package.ops:cut"', r"#1: call = 'no_such_package.ops:cut': module "
     r"'no_such_package.ops' cannot be imported"),
    ('call = "tests.helpers.user_ops:nothing"', r"module 'tests.helpers.user_ops' has no "
     r"'nothing'"),
    ('call = "tests.helpers.user_ops"', r"call must be an import path"),
    ('after = "read"', r"#1 needs call"),
    ('call = "tests.helpers.user_ops:cut"\nafter = "later"', r"after = 'later'"),
    ('call = "tests.helpers.user_ops:cut"\nkind = "sieve"', r"kind = 'sieve'"),
    ('call = "tests.helpers.user_ops:cut"\nversion = 2', r"version must be a string"),
    ('call = "tests.helpers.user_ops:cut"\nreason = "x"', r"reason is a filter's"),
])
def test_bad_operator_tables_are_refused_naming_the_key(files, tmp_path, table,
                                                         message) -> None:
    path = _toml(tmp_path, files, f"[[operators]]\n{table}\n")
    with pytest.raises(ConfigError, match=message) as err:
        load_recipe(path)
    assert str(path) in str(err.value)
    if "colour" in table:
        assert isinstance(err.value, UnknownKeyError) and err.value.key == "colour"


def test_a_python_operator_object_goes_in_as_it_is(files) -> None:
    from zephon_core import Map

    obj = Map(user_ops.no_sevens, name="mark", settings={"version": "3"})
    recipe = _recipe(files, operators=[UserOp(obj, after="tokenize")])
    names = [o.name for o in recipe.ops]
    assert recipe.ops[names.index("tokenize") + 1] is obj
    with pytest.raises(ConfigError, match="operators\\[0\\] is a function"):
        _recipe(files, operators=[user_ops.cut])
