"""cohort_torch.live forms a re-formed group only on the torch store of its own round: the
agent's store of each round holds the round's number (key cohort/round), and when rank 0
stays on the same host the next round's store listens on the same port. A worker that read
round 4's notice and reaches round 5's store must not join it (it would meet round 5's
ranks with round 4's rank and size); it forms round 5 once that notice arrives.

Drives Live._round_store, the connection step of Live.reform(), with real torch TCPStores
on 127.0.0.1 (port 0); the rest of the Live object (its channel) is not needed here.
"""
import datetime
import time

import pytest


@pytest.fixture
def live(in_process):
    import cohort_torch.live as module
    return module


class Worker:
    """What _round_store needs of a Live object: the newest notice the agent wrote, here
    the given notices in turn (the last one stays)."""

    def __init__(self, *notices):
        self.notices = list(notices)
        self.timeout = 5.0
        self.refreshes = 0

    def _refresh(self):
        self.refreshes += 1
        return self.notices.pop(0) if len(self.notices) > 1 else self.notices[0]


def notice(round_, port):
    return {"round": round_, "master_addr": "127.0.0.1", "master_port": port,
            "world_size": 2, "restart_count": 0}


def round_store(round_):
    """A torch store serving `round_`, as the agent's (on a free port)."""
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=5),
                          wait_for_workers=False)
    store.set("cohort/round", str(round_))
    return store


def test_the_store_of_its_own_round_is_joined(live):
    server = round_store(4)
    w = Worker(notice(4, server.port))
    store = live.Live._round_store(w, notice(4, server.port), time.monotonic() + 10)
    assert store is not None
    store.set("k", "v")  # the PrefixStore env:// uses, on the round's server
    assert server.get("/worker/attempt_0/default_pg/k") == b"v"


def test_the_next_rounds_store_on_the_same_port_is_not_joined(live):
    server = round_store(5)  # round 5's store where round 4's was
    # The agent's notice of round 5 arrives at the third read: then no store is returned.
    w = Worker(notice(4, server.port), notice(4, server.port), notice(5, server.port))
    began = time.monotonic()
    # None: round 4's group is never formed there; reform() goes on to round 5.
    assert live.Live._round_store(w, notice(4, server.port), time.monotonic() + 30) is None
    assert w.refreshes >= 3
    assert time.monotonic() - began < 15


def test_a_store_that_never_serves_the_round_is_an_error_at_the_deadline(live):
    server = round_store(7)
    w = Worker(notice(4, server.port))
    with pytest.raises(RuntimeError, match="round 4 .* did not answer"):
        live.Live._round_store(w, notice(4, server.port), time.monotonic() + 3)
