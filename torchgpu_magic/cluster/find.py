"""Finding the user's cluster object: ``--cluster NAME`` and bare ``--cluster``.

NAME may hold what users have at hand: an ipyparallel ``Client`` or view, an ``ipp.Cluster``, a Dask
``Client``, or a Dask cluster object (``LocalCluster``, dask-cuda's ``LocalCUDACluster``, dask-jobqueue's
clusters). A cluster object is reached through a client of it already in the namespace (or, for Dask, any
live client of it), else through one this package connects once and closes at ``%unload_ext``
(:func:`close_clients`).

Bare ``--cluster`` takes the one cluster the namespace holds, however many names point into it
(``rc`` and ``dv = rc[:]`` are one cluster): the view ``%px`` runs on when it is one of that cluster's,
else the Client (every engine). With nothing in the namespace, Dask's default client
(``distributed.default_client()``, what ``get_client()`` returns in a notebook) is used.

ipyparallel and distributed are imported only when already imported by the user: an object of theirs
cannot exist otherwise.
"""
from __future__ import annotations

import contextlib
import sys
import weakref
from typing import Any, Callable, Optional

from ..errors import MagicInputError
from .bridge import Bridge, ClusterGone
from .dask_bridge import DaskBridge, Workers, scheduler_address
from .ipp_bridge import IPyParallelBridge

HOW = ("start one first, e.g. rc = ipyparallel.Cluster(n=4).start_and_connect_sync(), or "
       "client = distributed.Client(LocalCluster())")

_OWNED: dict = {}  # id(cluster object) -> (weakref to it, the client this package connected to it)


class Kept(weakref.WeakKeyDictionary):
    """What the bridges of one shell keep between calls, per client: a Dask client's list of workers
    (:class:`~.dask_bridge.Workers`), so that one magic after another asks the scheduler at most once per
    :data:`~.dask_bridge.REFRESH` seconds. Keyed weakly on the client (a client the user drops is
    forgotten with it; nothing here keeps it alive); :meth:`clear` at ``%unload_ext``."""

    def workers(self, client: Any) -> Optional[Workers]:
        """The :class:`~.dask_bridge.Workers` kept for ``client`` (made on first use); None for an object
        that cannot be referred to weakly (then nothing is kept for it)."""
        try:
            return self.setdefault(client, Workers())
        except TypeError:
            return None


def _kinds() -> list:
    """(kind, classes) for the cluster libraries already imported."""
    out = []
    if "ipyparallel" in sys.modules:
        import ipyparallel

        views = (ipyparallel.Client, ipyparallel.DirectView, ipyparallel.LoadBalancedView)
        out += [("ipyparallel", views), ("ipyparallel cluster", (ipyparallel.Cluster,))]
    if "distributed" in sys.modules:
        import distributed
        from distributed.deploy.cluster import Cluster

        out += [("dask", (distributed.Client,)), ("dask cluster", (Cluster,))]
    return out


def kind_of(obj: Any, kinds: Optional[list] = None) -> str:
    """'ipyparallel' / 'ipyparallel cluster' / 'dask' / 'dask cluster', or '' for anything else
    (``kinds``: :func:`_kinds`' answer, when the caller asked it once for many objects)."""
    for kind, classes in _kinds() if kinds is None else kinds:
        if isinstance(obj, classes):
            return kind
    return ""


def candidates(ns: dict) -> dict:
    """The user's cluster objects in ``ns``, by name (names starting with '_' are IPython's output
    history, left out): ``{name: kind}``."""
    kinds = _kinds()
    found = {name: kind_of(obj, kinds) for name, obj in ns.items() if not name.startswith("_")}
    return {name: kind for name, kind in found.items() if kind}


def connect(ns: dict, name: Optional[str], px_view: Any = None, kept: Optional[Kept] = None) -> Bridge:
    """The :class:`Bridge` for ``ns[name]``, or for the one cluster in ``ns`` when ``name`` is empty
    (``px_view``: the view the shell's ``%px`` runs on, preferred when it is that cluster's; ``kept``:
    what earlier bridges of the same shell kept, :class:`Kept`). Raises
    :class:`MagicInputError` naming the candidates when there are none, several clusters, or ``name``
    is not one; :class:`ClusterGone` for a cluster object that no longer runs."""
    if name and not name.startswith("_") and kind_of(ns.get(name)):
        return _bridge(name, ns[name], ns, kept)  # the namespace is scanned only to list what is there
    found = candidates(ns)
    listed = ", ".join(f"{n} ({k})" for n, k in sorted(found.items())) or "none"
    if name:
        what = "is not defined" if name not in ns else f"is a {type(ns[name]).__name__}"
        raise MagicInputError(f"--cluster {name}: {name} {what}, not an ipyparallel Client/view/Cluster "
                              f"or a Dask Client/cluster; cluster objects here: {listed}")
    if not found:
        default = _dask_default()
        if default is not None:
            return _bridge("default_client()", default, ns, kept)
        raise MagicInputError(f"--cluster: no ipyparallel Client/view/Cluster or Dask Client/cluster in the "
                              f"namespace; {HOW}")
    groups: dict = {}
    for each in sorted(found):
        groups.setdefault(_cluster_key(ns[each]), []).append(each)
    if len(groups) > 1:
        said = "; ".join(", ".join(names) for names in groups.values())
        raise MagicInputError(f"--cluster: several clusters here ({said}); name one: --cluster NAME")
    (names,) = groups.values()
    chosen = _pick(names, ns, px_view)
    return _bridge(chosen, ns[chosen], ns, kept)


def _pick(names: list, ns: dict, px_view: Any) -> str:
    """Among names for one cluster: the view %px runs on, else the Client, else the first view."""
    views = [n for n in names if px_view is not None and ns[n] is px_view]
    clients = [n for n in names if kind_of(ns[n]) in ("ipyparallel", "dask")
               and getattr(ns[n], "client", ns[n]) is ns[n]]
    return (views + clients + names)[0]


def _cluster_key(obj: Any) -> tuple:
    """One key per cluster: a view, its client and its cluster object share it (Dask's: the scheduler's
    address)."""
    kind = kind_of(obj)
    if kind == "ipyparallel":
        client = getattr(obj, "client", None) or obj
        cluster = getattr(client, "cluster", None)
        return ("ipp", id(cluster) if cluster is not None else id(client))
    if kind == "ipyparallel cluster":
        return ("ipp", id(obj))
    if kind == "dask":
        return ("dask", scheduler_address(obj) or id(obj))
    return ("dask", getattr(obj, "scheduler_address", "") or id(obj))


def _bridge(name: str, obj: Any, ns: dict, kept: Optional[Kept] = None) -> Bridge:
    kind = kind_of(obj)
    if kind.startswith("ipyparallel"):
        return IPyParallelBridge(name, obj if kind == "ipyparallel" else _ipp_client(name, obj, ns))
    client = obj if kind == "dask" else _dask_client(name, obj, ns)
    return DaskBridge(name, client, cluster_ref="" if kind == "dask" else name,
                      kept=kept.workers(client) if kept is not None else None)


def _owned(cluster: Any, connect: Callable[[], Any]) -> Any:
    """The client kept for ``cluster`` while it is open, else a new one from ``connect`` (then kept)."""
    entry = _OWNED.get(id(cluster))
    if entry is not None and entry[0]() is cluster and not getattr(entry[1], "_closed", False) \
            and getattr(entry[1], "status", "running") != "closed":
        return entry[1]
    client = connect()
    _OWNED[id(cluster)] = (weakref.ref(cluster), client)
    return client


def _ipp_client(name: str, cluster: Any, ns: dict) -> Any:
    """A client of the ``ipp.Cluster`` ``cluster``: one in ``ns``, else one connected here (kept)."""
    for obj in ns.values():
        client = getattr(obj, "client", obj) if kind_of(obj) == "ipyparallel" else None
        if client is not None and getattr(client, "cluster", None) is cluster and not client._closed:
            return client

    def start() -> Any:
        if getattr(cluster, "controller", None) is None:
            raise ClusterGone(f"--cluster {name}: this ipp.Cluster is not running; start it: "
                              f"rc = {name}.start_and_connect_sync()")
        return cluster.connect_client_sync()

    return _owned(cluster, start)


def _dask_client(name: str, cluster: Any, ns: dict) -> Any:
    """A client of the Dask cluster object ``cluster``: one in ``ns`` or any live one of it, else one
    connected here (kept)."""
    import distributed

    address = getattr(cluster, "scheduler_address", None)
    if getattr(cluster, "status", None) is not None and str(getattr(cluster.status, "name", cluster.status)) \
            in ("closing", "closed", "failed"):
        raise ClusterGone(f"--cluster {name}: this Dask cluster is closed; start a new one and connect: "
                          "client = distributed.Client(LocalCluster())")
    clients = [obj for obj in ns.values() if isinstance(obj, distributed.Client)]
    clients += list(distributed.Client._instances)
    for client in clients:
        if client.status == "running" and (getattr(client, "cluster", None) is cluster
                                           or (address and scheduler_address(client) == address)):
            return client
    return _owned(cluster, lambda: distributed.Client(cluster, set_as_default=False))


def _dask_default() -> Any:
    """Dask's default client (``distributed.default_client()``), or None without one."""
    if "distributed" not in sys.modules:
        return None
    import distributed

    try:
        return distributed.default_client()
    except ValueError:
        return None


def close_clients() -> None:
    """Close the clients this package connected to cluster objects (at ``%unload_ext``)."""
    while _OWNED:
        _, (_, client) = _OWNED.popitem()
        with contextlib.suppress(Exception):  # a client already gone: nothing to close
            client.close()
