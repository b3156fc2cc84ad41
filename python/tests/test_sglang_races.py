"""SGLang calls a request's clear() on whatever thread drops it, while the
scheduler's poll or abort may be letting the same request go: the two
check-then-act sequences on the request's kvfence handles must not
interleave. A hook parks the first thread inside its sequence while the
second calls clear(); the receiver's lock makes the second wait. The
known-unsafe variant (no lock) must show a call on a closed handle."""
import threading

import pytest

from kvfence import staging
from kvfence.sglang import KVFenceBackendProvider

from sglang_topo import Deployment
from test_sglang_topologies import finish, settle

P = KVFenceBackendProvider()
WAIT_S = 120  # per event; generous for a loaded 2-core machine


@pytest.fixture(scope="module")
def dep():
    d = Deployment(P, prefill_tp=(1,), decode_tp=1, extra=dict(slots=24, source_pages=24))
    yield d
    d.close()


class Recorder:
    """Forwards to a kvfence handle and records each call, so a call made
    after the handle's close shows (the handle's single owner is broken)."""

    def __init__(self, inner, log):
        self._inner, self._log = inner, log

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr):
            self._log.append(name)
            return attr

        def call(*args, **kwargs):
            self._log.append(name)
            return attr(*args, **kwargs)
        return call


def after_close(log):
    return log[log.index("close") + 1:] if "close" in log else []


class Contended:
    """The request's lock, telling the test when a second thread has to
    wait for it (the interleaving the lock exists to prevent)."""

    def __init__(self, inner, waiting):
        self.inner, self.waiting = inner, waiting

    def __enter__(self):
        if not self.inner.acquire(blocking=False):
            self.waiting.set()
            self.inner.acquire()
        return self

    def __exit__(self, *exc):
        self.inner.release()


class NoLock:
    """The known-unsafe variant: calls interleave freely."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def race_clear(x, where, safe):
    """Parks the thread that reaches `where` while another thread calls
    x.clear(); resumes once clear() returned or waits for the lock."""
    moved, errs = threading.Event(), []
    x._serial = Contended(x._serial, moved) if safe else NoLock()

    def clear():
        try:
            x.clear()
        except Exception as exc:  # noqa: BLE001  (clear never raises: reported below)
            errs.append(exc)
        moved.set()

    parked = []

    def hook(at):
        if at != where or parked:
            return
        parked.append(threading.Thread(target=clear, daemon=True))
        parked[0].start()
        assert moved.wait(WAIT_S), "clear() neither ran nor waited"
    x._interleave = hook
    return parked, errs


def joined(parked, errs):
    assert parked, "the hook never ran: the race was not driven"
    parked[0].join(WAIT_S)
    assert not parked[0].is_alive(), "clear() stuck"
    assert not errs, errs


@pytest.mark.parametrize("safe", [True, False], ids=["locked", "known-unsafe"])
def test_receiver_clear_racing_its_let_go(dep, safe):
    base = staging.handles_live()
    room = 401 if safe else 402
    rvs = dep.receivers(0, room)
    rv = rvs[0]
    rv.send_metadata([1, 2], 1, None, decode_prefix_len=0)
    assert rv.exposed
    log = []
    rv.rv = Recorder(rv.rv, log)
    parked, errs = race_clear(rv, "let_go", safe)
    rv.abort()  # the poll/abort that lets the request go, parked at its check
    joined(parked, errs)
    if safe:
        assert after_close(log) == [], "a call on a closed handle: %s" % log
        assert log[:1] == ["abandon"] and rv.held
    else:
        assert after_close(log) != [], "the unsafe variant went unnoticed: %s" % log
    finish(rvs, [])
    settle(dep, base)


@pytest.mark.parametrize("safe", [True, False], ids=["locked", "known-unsafe"])
def test_sender_clear_racing_its_release(dep, safe):
    base = staging.handles_live()
    room = 411 if safe else 412
    rvs = dep.receivers(0, room)
    rvs[0].send_metadata([1, 2], 1, None, decode_prefix_len=0)
    snds = dep.senders(0, room)
    s = snds[0]
    log = []
    s.snds = [(Recorder(snd, log), part, parts) for snd, part, parts in s.snds]
    parked, errs = race_clear(s, "release", safe)
    s.abort()
    joined(parked, errs)
    if safe:
        assert after_close(log) == [], "a call on a closed handle: %s" % log
        assert log == ["abort", "close"]
    else:
        assert after_close(log) != [], "the unsafe variant went unnoticed: %s" % log
    dep.until(lambda: rvs[0].poll() == 0, "decode learns of prefill's abort")
    finish(rvs, snds)
    settle(dep, base)
