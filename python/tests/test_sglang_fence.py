"""send() only queues the copy of a chunk's pages (Go threads read SGLang's
KV pages after it returned), so the copy must be over before SGLang may
free those pages: once the TP-reduced poll() is Success or Failed
(prefill.py's inflight queue frees them with release_kv_cache right
after; see KVFenceKVSender.send).

- After Success: the pages are overwritten (SGLang gave them to another
  request) and decode still gets every original byte, none of the poison.
- After a Failed of another rank: SGLang calls failure_exception() on every
  rank, then frees the pages. This rank's own poll was still Transferring
  (its copies queued); failure_exception() must fence them. Checked by the
  handles: a kvfence sender handle closes only after its queued copies
  ended (kvfence_close settles them), a receiver is let go only after its
  scatter. The known-unsafe variant (failure_exception that only raises,
  as before) leaves the handles open with copies that may still run, and
  the check catches it."""
import ctypes
import time

import pytest

import kvfence
from kvfence import errors, sglang
from kvfence.sglang import KVFenceBackendProvider

from sglang_harness import LAYERS, Cluster, check_decode

POISON = b"\xee"
WAIT_S = 120  # per wait; generous for a loaded 2-core machine


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(KVFenceBackendProvider())
    yield c
    c.close()


def poison(c, p_idx):
    """SGLang gave the prefill pages p_idx to another request."""
    for eng in c.p_eng:
        for b in range(2 * LAYERS):
            for i in p_idx:
                ctypes.memmove(ctypes.addressof(eng.kv[b]) + i * eng.item, POISON * eng.item, eng.item)


def test_pages_poisoned_after_success_never_reach_decode(cluster):
    c, room, p_idx, d_idx = cluster, 61, [8, 3, 12, 6], [2, 9, 4, 11]
    rv, senders = c.start(room, len(p_idx), d_idx, 1, p_idx)
    c.send_chunk(senders, room, 1, p_idx, 0, 2, False, 1)
    c.send_chunk(senders, room, 1, p_idx, 2, 4, True, 1)
    end = time.monotonic() + WAIT_S
    while c.all_reduce_min(s.poll() for s in senders) not in (0, 4):  # prefill's inflight queue
        c.decode_poll(rv, 1, room)  # decode's scheduler keeps polling meanwhile
        assert time.monotonic() < end, "prefill never ended"
        time.sleep(0.005)
    assert c.all_reduce_min(s.poll() for s in senders) == 4
    poison(c, p_idx)  # release_kv_cache: the pages are another request's now
    d, p = c.run_until_final(rv, senders, 1, room)
    assert (d, p) == (4, 4)
    assert check_decode(c.d_eng, room, 1, d_idx) == 0  # no poisoned (or other wrong) head anywhere
    rv.clear()
    for s in senders:
        s.clear()


def unfenced(senders, rv):
    """What may still touch SGLang's pages after failure_exception()
    returned on every rank: open kvfence sender handles (their queued
    copies may still run) and a receiver not let go (its scatter)."""
    left = ["sender %d handle %d open" % (r, k) for r, s in enumerate(senders)
            for k, (snd, _, _) in enumerate(s.snds) if snd._h]
    if not rv.held:
        left.append("receiver not let go")
    return left


def fail_elsewhere(c, room, p_idx, d_idx):
    """A request whose copies are queued and whose own polls are not
    terminal (its last chunk is not sent: Success is impossible), ended by
    another rank's Failed: SGLang calls failure_exception() on each rank."""
    rv, senders = c.start(room, len(p_idx), d_idx, 2, p_idx)
    c.send_chunk(senders, room, 1, p_idx, 0, 2, False, 2)
    polls = [s.poll() for s in senders] + [c.decode_poll(rv, 2, room)]
    assert all(p in (1, 2, 3) for p in polls), polls  # not terminal on any rank here
    raised = []
    for obj in senders + [rv]:
        with pytest.raises(kvfence.KVFenceError) as exc:
            obj.failure_exception()
        raised.append(exc.value)
    return rv, senders, raised


def test_failure_exception_fences_the_copies_of_a_rank_still_transferring(cluster):
    c, p_idx, d_idx = cluster, [1, 5, 7, 10], [0, 3, 6, 13]
    rv, senders, raised = fail_elsewhere(c, 62, p_idx, d_idx)
    assert unfenced(senders, rv) == []
    assert all(getattr(e, "is_from_another_rank", False) for e in raised)  # SGLang logs these at debug level
    assert [s.poll() for s in senders] + [rv.poll()] == [0, 0, 0]
    poison(c, p_idx)
    rv.clear()
    for s in senders:
        s.clear()


def test_unsafe_failure_exception_is_caught(cluster, monkeypatch):
    """The known-unsafe variant: failure_exception() only raises."""
    def raise_only(self):
        raise self.error or errors.Unavailable("kvfence: room %d failed" % self.room)
    monkeypatch.setattr(sglang._Outcome, "failure_exception", raise_only)
    c = cluster
    rv, senders, _ = fail_elsewhere(c, 63, [2, 4, 9, 11], [1, 5, 8, 14])
    assert unfenced(senders, rv) != [], "the unsafe variant was not caught"
    for obj in senders + [rv]:
        obj.abort()
        obj.clear()
