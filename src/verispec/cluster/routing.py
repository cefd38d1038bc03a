"""Prefix affinity: requests that share a prefix go to the replica that served it last.

`affinity_keys(path, body)` turns a request into hashes of its prefixes, shortest first: for chat,
the messages up to each message (a conversation's next turn repeats the earlier ones; a common
system prompt is the first); for completions, the prompt cut every `BLOCK` characters. The ingress
passes them to the replica call as the keyword `affinity`; `PrefixAffinityRouter` (a Ray Serve
request router, run in the ingress's process) reads them, sends the request to the replica that
last served the longest known key unless that replica is `imbalance` requests busier than the least
loaded one, and otherwise to the least loaded. Either way, Ray's own probe still refuses a replica
whose queue is full (`max_ongoing_requests`).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from typing import Any, Hashable

BLOCK = 256  # characters of a completion prompt per affinity key
MAX_KEYS = 32  # keys per request (the longest prefixes are dropped beyond)
MAX_REMEMBERED = 100_000  # keys the router remembers; least recently used leave first


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def affinity_keys(path: str, body: Any) -> list[str]:
    """Hashes of the request's prefixes, shortest first ([] when it has none we can read)."""
    if not isinstance(body, dict):
        return []
    model = str(body.get("model", ""))
    if path.endswith("/chat/completions") and isinstance(body.get("messages"), list):
        messages = body["messages"]
        keys, running = [], hashlib.blake2b(model.encode(), digest_size=12)
        for m in messages[:MAX_KEYS]:
            running.update(json.dumps(m, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass"))
            keys.append("chat:" + running.copy().hexdigest())
        return keys
    prompt = body.get("prompt")
    if path.endswith("/completions") and isinstance(prompt, str) and prompt:
        cuts = list(range(BLOCK, len(prompt), BLOCK))[: MAX_KEYS - 1] + [len(prompt)]
        return ["text:" + _digest(model + "\0" + prompt[:c]) for c in cuts]
    if path.endswith("/completions") and isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return ["ids:" + _digest(model + "\0" + json.dumps(prompt))]
    return []


class AffinityTable:
    """key -> the replica that last served a request with that prefix (bounded, LRU)."""

    def __init__(self, capacity: int = MAX_REMEMBERED) -> None:
        self.capacity = capacity
        self._table: OrderedDict[str, Hashable] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def lookup(self, keys: list[str], alive: set) -> Hashable | None:
        """The replica of the longest key whose replica is still alive."""
        for key in reversed(keys):
            replica = self._table.get(key)
            if replica is not None and replica in alive:
                self._table.move_to_end(key)
                return replica
        return None

    def record(self, keys: list[str], replica: Hashable) -> None:
        for key in keys:
            self._table[key] = replica
            self._table.move_to_end(key)
        while len(self._table) > self.capacity:
            self._table.popitem(last=False)

    def forget(self, replica: Hashable) -> None:
        for key in [k for k, r in self._table.items() if r == replica]:
            del self._table[key]


def choose(keys: list[str], loads: dict[Hashable, int], table: AffinityTable, imbalance: int) -> list[list[Hashable]]:
    """Ranks of replicas (best first) for a request, from `loads` (replica -> requests it holds, as
    last seen; only replicas with room). The affinity replica alone first when it is within
    `imbalance` of the least loaded; then every replica, least loaded first (Ray probes that rank
    and takes the emptiest one that accepts)."""
    if not loads:
        return []
    everyone = sorted(loads, key=lambda r: (loads[r], random.random()))  # ties at random: new prefixes spread
    preferred = table.lookup(keys, set(loads)) if keys else None
    if preferred is not None and loads[preferred] - loads[everyone[0]] <= imbalance:
        return [[preferred], everyone]
    return [everyone]


def _ray_router():
    """The Ray Serve router class, defined only where Ray is installed (the import is deferred so
    that `affinity_keys` and `choose` work, and are tested, without Ray)."""
    from ray.serve.request_router import RequestRouter

    class PrefixAffinityRouter(RequestRouter):
        def initialize_state(self, imbalance: int = 4, capacity: int = MAX_REMEMBERED) -> None:
            self.imbalance = imbalance
            self.table = AffinityTable(capacity)

        async def choose_replicas(self, candidate_replicas, pending_request=None):
            if not hasattr(self, "table"):  # initialize_state not called (no router kwargs)
                self.initialize_state()
            available = self.select_available_replicas(candidate_replicas)
            by_id = {r.replica_id: r for r in available}
            cache = self.replica_queue_len_cache
            loads = {rid: cache.get(rid) or 0 for rid in by_id}
            keys = (pending_request.kwargs.get("affinity") or []) if pending_request is not None else []
            ranks = choose(keys, loads, self.table, self.imbalance)
            if not ranks:  # every replica full as last seen: let Ray probe them all
                return [list(candidate_replicas)]
            return [[by_id[rid] for rid in rank] for rank in ranks]

        def on_request_routed(self, pending_request, replica_id, result) -> None:
            if not hasattr(self, "table"):
                self.initialize_state()
            keys = pending_request.kwargs.get("affinity") if pending_request is not None else None
            if keys:
                self.table.record(keys, replica_id)

        def on_replica_actor_died(self, replica_id) -> None:
            super().on_replica_actor_died(replica_id)
            if hasattr(self, "table"):
                self.table.forget(replica_id)

    return PrefixAffinityRouter


def __getattr__(name: str):
    if name == "PrefixAffinityRouter":  # `verispec.cluster.routing.PrefixAffinityRouter`, an import path Ray can load
        cls = _ray_router()
        cls.__module__ = __name__
        globals()[name] = cls
        return cls
    raise AttributeError(name)
