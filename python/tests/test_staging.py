"""The C ABI's staging calls (kvfence.staging) refuse bad input with a
classified error and the process stays up: page indices outside the
engine's buffers, a layout that does not fit the pages, a scatter before the
request was handed off, a handle of the wrong kind."""
import ctypes
import time

import pytest

from kvfence import api, errors, staging


def linked_pair(shard_bytes):
    d = api.Decode(rank=0, slots=8, shard_bytes=shard_bytes, shards=1, control_addr="127.0.0.1:0", log_level="error")
    p = api.Prefill(rank=1000, decode_addr=d.addr, source_pages=8, shard_bytes=shard_bytes, log_level="error")
    p.wait_linked()
    d.wait_linked([1000])
    yield d, p
    p.close()
    d.close()


@pytest.fixture(scope="module")
def pair():
    yield from linked_pair(64)


def engine(pages=4, item=32, nbuf=2):
    bufs = [(ctypes.c_char * (pages * item))() for _ in range(nbuf)]
    return bufs, staging.Layout([ctypes.addressof(b) for b in bufs], [len(b) for b in bufs], [item] * nbuf, 1)


def test_round_trip_and_refusals(pair):
    d, p = pair
    live = staging.handles_live()
    src, lay = engine()
    for i, b in enumerate(src):
        ctypes.memmove(b, bytes(range(i * 10, i * 10 + 128)), 128)
    dst, dlay = engine()
    rv, snd = d.receiver(5), p.sender(5)
    rv.init(2, [1000])
    snd.init(2)
    with pytest.raises(errors.InvalidArgument):
        staging.gather(snd, lay, [0, 4], 0, upto=2, total=2)  # page 4 of a 4-page buffer
    with pytest.raises(errors.InvalidArgument):
        staging.gather(snd, lay, [0, 1], 1, upto=2, total=2)  # pages [1, 3) of a 2-page request
    with pytest.raises(errors.InvalidArgument):
        staging.gather(snd, lay, [0], 0, part=0, parts=3)  # 32 bytes per token in 3 parts
    with pytest.raises(errors.InvalidArgument):
        staging.gather(rv, lay, [0], 0)  # a receiver is not a sender
    with pytest.raises(errors.FailedPrecondition):
        staging.scatter(rv, dlay, [0, 1])  # not handed off yet
    staging.gather(snd, lay, [2, 0], 0, upto=2, total=2)
    rv.wait(20)
    assert staging.gather_wait(snd, 5)
    staging.scatter(rv, dlay, [3, 1])
    assert staging.scatter_done(rv, 5)
    for b_src, b_dst in zip(src, dst):
        assert bytes(b_dst[3 * 32:4 * 32]) == bytes(b_src[2 * 32:3 * 32])
        assert bytes(b_dst[1 * 32:2 * 32]) == bytes(b_src[0:32])
    rv.finish()
    for h in (rv, snd, lay, dlay):
        h.close()
    with pytest.raises(errors.InvalidArgument):
        staging.Layout([0], [64], [32], 1)  # a NULL buffer
    with pytest.raises(errors.InvalidArgument):
        staging.Layout([1], [64], [30], 4)  # items not whole tokens
    assert staging.handles_live() == live


def test_a_fault_on_engine_memory_is_an_error_not_a_crash(pair):
    """An address that is not mapped (a stale or forged pointer from the
    engine) faults inside the copy on a Go thread: the gather fails with
    InvalidArgument and the process lives on."""
    d, p = pair
    lay = staging.Layout([4096], [1 << 20], [32], 1)  # the zero page: never mapped
    snd = p.sender(6)
    snd.init(1)
    staging.gather(snd, lay, [0], 0, upto=1, total=1)
    with pytest.raises(errors.InvalidArgument, match="faulted"):
        for _ in range(200):
            if staging.gather_wait(snd, 0.1):
                break
    snd.abort()
    snd.close()
    lay.close()
    assert p.linked  # the rank's loop survived the fault


def test_abandon_after_handoff_gives_slots_back(pair):
    """An engine may let go of a request that was handed off since it last
    polled (SGLang's and vLLM's classes can). abort alone changes nothing
    then (the request stays readable, its slots in use until finish: an
    engine may still use it); abandon gives the slots back either way."""
    d, p = pair
    rv, snd = d.receiver(7), p.sender(7)
    rv.init(1, [1000])
    snd.init(1)
    snd.write(0, bytes(range(64)))
    snd.send(1)
    snd.finish(1)
    assert rv.wait(20) == api.KVPoll.Success
    rv.abort()
    assert bytes(rv.read(0, 1)) == bytes(range(64)) and not rv.released, "abort stopped a handed-off request"
    rv.abandon()
    for _ in range(2000):  # one step (a loop round trip), polled every 10 ms
        if rv.released:
            break
        time.sleep(0.01)
    assert rv.released, "a handed-off request's slots stayed in use after abandon"
    assert rv.poll() == api.KVPoll.Success  # it was handed off; letting it go changes no outcome
    rv.close()
    snd.close()


@pytest.fixture(scope="module")
def big_pair():
    yield from linked_pair(16384)


@pytest.mark.parametrize("item,page_size,src_idx,dst_idx", [
    (8192, 2, [5, 0, 3, 2], [1, 4, 0, 5]),  # 4 KiB runs
    (2048, 1, [1, 2, 3, 4], [2, 3, 4, 5]),  # 2 KiB runs, consecutive indices
    (2048, 1, [4, 0, 5, 2], [3, 1, 0, 4]),  # 2 KiB runs, scattered
    (512, 1, [4, 0, 5, 2], [3, 1, 0, 4]),  # 512-byte runs: memmove
])
def test_streamed_round_trip(big_pair, item, page_size, src_idx, dst_idx):
    """Gathers and scatters of runs long enough for non-temporal stores
    (and, for contrast, short ones) move every byte and nothing else: each engine page holds its own pattern, untouched pages stay
    zero."""
    d, p = big_pair
    pages, nbuf = 6, 2
    src = [(ctypes.c_char * (pages * item))() for _ in range(nbuf)]
    dst = [(ctypes.c_char * (pages * item))() for _ in range(nbuf)]
    for i, b in enumerate(src):
        ctypes.memmove(b, bytes((k * 7 + k // 4096 + i * 3 + 1) & 0xFF for k in range(len(b))), len(b))

    def layout(bufs):
        return staging.Layout([ctypes.addressof(b) for b in bufs], [len(b) for b in bufs], [item] * nbuf, page_size)
    lay, dlay = layout(src), layout(dst)
    room = 40 + item // 1024 + src_idx[0]
    rv, snd = d.receiver(room), p.sender(room)
    rv.init(len(src_idx), [1000])
    snd.init(len(src_idx))
    staging.gather(snd, lay, src_idx, 0, upto=len(src_idx), total=len(src_idx))
    rv.wait(20)
    assert staging.gather_wait(snd, 5)
    staging.scatter(rv, dlay, dst_idx)
    assert staging.scatter_done(rv, 5)
    for b_src, b_dst in zip(src, dst):
        for s, t in zip(src_idx, dst_idx):
            assert bytes(b_dst[t * item:(t + 1) * item]) == bytes(b_src[s * item:(s + 1) * item]), (s, t)
        for t in set(range(pages)) - set(dst_idx):
            assert bytes(b_dst[t * item:(t + 1) * item]) == bytes(item), t
    rv.finish()
    for h in (rv, snd, lay, dlay):
        h.close()
