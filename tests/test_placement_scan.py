"""placement/scan.py on CPU with `meta`: namespace snapshots and the %whereis table."""
from __future__ import annotations

import gc
import weakref

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchgpu_magic.placement import scan, table

# ---- namespace_snapshot / changed ---------------------------------------------------------------------


def test_snapshot_lists_tensors_modules_optimizers_and_small_containers():
    model = torch.nn.Linear(3, 2)
    ns = {
        "x": torch.ones(3), "model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1),
        "_hidden": torch.ones(1), "n": 3, "batch": [torch.ones(2), "label"], "d": {"w": torch.ones(1)},
        "Out": {1: torch.ones(1)},
    }
    snap = scan.namespace_snapshot(ns)
    assert set(snap) == {"x", "model", "opt", "batch[0]", "d['w']"}
    assert snap["x"].kind == "tensor" and snap["x"].devices == ("cpu",) and snap["x"].nbytes == 12
    assert snap["model"].kind == "module" and snap["model"].nbytes == 8 * 4
    assert snap["opt"].kind == "optimizer"
    assert "float32" in snap["x"].summary and "(3,)" in snap["x"].summary


def test_snapshot_holds_no_reference_and_fingerprint_tracks_changes():
    x = torch.ones(3)
    model = torch.nn.Linear(2, 2)
    ns = {"x": x, "model": model}
    before = scan.namespace_snapshot(ns)
    ref = weakref.ref(x)
    replacement = torch.ones(3)  # made while x lives: another object, never x's recycled id
    del ns["x"], x
    gc.collect()
    assert ref() is None, "a snapshot must not keep a tensor alive"
    ns["x"] = replacement
    model.to("meta")  # moved in place
    after = scan.namespace_snapshot(ns)
    names = [p.name for p in scan.changed(before, after)]
    assert names == ["model", "x"] or sorted(names) == ["model", "x"]
    assert after["model"].devices == ("meta",)
    assert scan.changed(after, scan.namespace_snapshot(ns)) == []
    ns["x"] = ns["x"].to(torch.float64)
    assert [p.name for p in scan.changed(after, scan.namespace_snapshot(ns))] == ["x"]


def _view(snap: dict) -> list:
    """A snapshot as comparable data: names in order, with what each entry says."""
    return [(name, p.kind, p.devices, p.summary, p.nbytes, p.fingerprint) for name, p in snap.items()]


_STEPS = st.lists(st.tuples(
    st.sampled_from(["new", "rebind", "inplace", "move", "delete", "to_int", "append", "pop", "refill",
                     "model_meta", "new_name"]),
    st.integers(0, 5)), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_STEPS)
def test_incremental_snapshot_matches_a_fresh_one_after_any_changes(steps):
    """The cache only skips work: after any sequence of rebinds, in-place changes, moves, deletions,
    container edits and new names, the snapshot equals one taken from scratch, in the namespace's order."""
    ns: dict = {"_hidden": torch.ones(1), "n": 3, "model": torch.nn.Linear(2, 2), "batch": [torch.ones(2)]}
    ns.update({f"t{i}": torch.ones(i + 1) for i in range(6)})
    cache = scan.SnapshotCache()
    before = scan.namespace_snapshot(ns, cache)
    for step, (action, i) in enumerate(steps):
        name = f"t{i}"
        if action == "new":
            ns[name] = torch.zeros(i + 2)
        elif action == "rebind" and isinstance(ns.get(name), torch.Tensor):
            ns[name] = ns[name].to(torch.float64)
        elif action == "inplace" and isinstance(ns.get(name), torch.Tensor):
            ns[name].resize_(i + 3)
        elif action == "move" and isinstance(ns.get(name), torch.Tensor):
            ns[name] = ns[name].to("meta")
        elif action == "delete":
            ns.pop(name, None)
        elif action == "to_int":
            ns[name] = i
        elif action == "append":
            ns["batch"].append(torch.ones(i + 1))
        elif action == "pop" and ns["batch"]:
            ns["batch"].pop()
        elif action == "refill":
            ns["batch"] = [torch.ones(i + 1, dtype=torch.int64)]
        elif action == "model_meta":
            ns["model"].to_empty(device="meta" if i % 2 else "cpu")
        elif action == "new_name":
            ns[f"fresh{step}"] = torch.ones(1)
            ns[f"_i{step}"] = "cell source"
        after = scan.namespace_snapshot(ns, cache)
        fresh = scan.namespace_snapshot(ns, scan.SnapshotCache())
        assert _view(after) == _view(fresh)
        reported = {p.name for p in scan.changed(before, after)}
        assert reported == {n for n, p in after.items()
                            if n not in before or before[n].fingerprint != p.fingerprint}
        before = after


def test_unchanged_namespace_returns_the_same_dict_and_caches_are_separate():
    ns = {f"t{i}": torch.ones(2) for i in range(5)}
    mine = scan.SnapshotCache()
    first = scan.namespace_snapshot(ns, mine)
    scan.namespace_snapshot({"other": torch.ones(1)})  # the module-wide cache, not ``mine``
    assert scan.namespace_snapshot(ns, mine) is first
    ns["t2"].add_(1)  # in place: the version counter moves
    after = scan.namespace_snapshot(ns, mine)
    assert after is not first and [p.name for p in scan.changed(first, after)] == ["t2"]
    assert list(after) == [f"t{i}" for i in range(5)]


# ---- the namespace table -------------------------------------------------------------------------------


def test_table_groups_by_device_and_counts_shared_storage_once():
    base = torch.zeros(256)  # 1 KiB
    tied = torch.nn.Linear(4, 4, bias=False)
    other = torch.nn.Linear(4, 4, bias=False)
    other.weight = tied.weight  # tied weights
    ns = {"base": base, "view": base[10:20], "tied": tied, "other": other, "m": torch.ones(8, device="meta")}
    report = table.namespace_report(ns)
    assert report.totals["cpu"] == 1024 + 64
    rows = {r.name: r for r in report.rows}
    assert rows["view"].note == "shares storage with base" and rows["view"].nbytes == 40
    assert rows["m"].device == "meta"
    text = report.to_text()
    assert "cpu: 4 objects, 1.06 KiB" in text and "meta: 1 object, no memory" in text
    assert "<table" in report._repr_html_()
    assert report.to_dict()["totals"]["cpu"] == 1088


def test_table_looks_into_containers_and_shows_pinned_and_grad():
    w = torch.ones(2, requires_grad=True)
    ns = {"batch": (torch.ones(3), torch.ones(2, dtype=torch.int64)), "params": {"w": w},
          "deep": [[torch.ones(1)]]}
    rows = {r.name: r for r in table.namespace_report(ns).rows}
    assert set(rows) == {"batch[0]", "batch[1]", "params['w']", "deep[0][0]"}
    assert rows["batch[1]"].dtype == "int64"
    assert rows["params['w']"].grad == "yes" and rows["batch[0]"].pinned == "no"


def test_out_cache_only_objects_are_marked_with_their_memory():
    kept = torch.ones(10)
    only_out = torch.zeros(100)
    view_of_kept = kept[:5]
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    ns = {"kept": kept, "Out": {3: kept, 4: only_out, 5: view_of_kept, 6: model[0], 7: model[0].weight},
          "_": view_of_kept, "_4": only_out, "model": model}
    report = table.namespace_report(ns)
    rows = {r.name: r for r in report.rows}
    assert "Out[3]" not in rows  # also bound to a user name
    assert rows["Out[4]"].note == "only in Out"
    assert report.out_only_names == ["Out[4]", "Out[5]"]
    assert report.out_only_bytes == 400  # the view of `kept` holds no extra memory
    assert "%reset -f out" in report.to_text()


def test_split_module_flagged_in_table():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[1].to("meta")
    rows = [r for r in table.namespace_report({"model": model}).rows if r.name == "model"]
    assert {r.device for r in rows} == {"cpu", "meta"}
    assert all("split across cpu, meta" in r.note for r in rows)


def test_table_shows_its_text_in_ipythons_plain_text_formatter():
    """Terminals, VS Code's text view and static exports show only text/plain: a dataclass's
    generated __repr__ must not win over the report's _repr_pretty_."""
    from IPython.core.formatters import PlainTextFormatter

    report = table.namespace_report({"model": torch.nn.Linear(3, 2), "x": torch.ones(3)})
    assert PlainTextFormatter()(report) == report.to_text()
