"""vLLM's KV cache layouts, as kvfence pages.

vLLM hands a connector one tensor per attention layer, in the backend's
logical shape; an HND cache is the same logical shape over a permuted
buffer (gpu_model_runner permutes the view, so the strides say it):

- FlashAttention/Triton: (2, num_blocks, block_size, kv_heads, head_size)
- FlashInfer:            (num_blocks, 2, block_size, kv_heads, head_size)
- MLA:                   (num_blocks, block_size, latent_size)

A kvfence page is one vLLM block across every layer. On the wire each
writer's shard is canonical — per layer, (kv, tokens, heads, head bytes),
C order — so a prefill instance in NHD feeds a decode instance in HND, and
a page never depends on either side's strides. The order is vLLM's
default (NHD): an NHD cache sending all its heads copies whole runs.

Host caches are read and written here with numpy views. GPU caches (the
CUDA driver says the tensor's memory is device memory) are never touched
from host code: DeviceCaches only describes them to the C ABI's staged
layout (kvfence.staging: buffer i at ptrs[i], items[i] bytes per block, each
token's heads contiguous), whose gather and scatter copy through the driver
and pinned host memory on Go threads. That plan produces the same canonical
shard: per layer, (kv, tokens, heads) — FlashAttention as two buffers per
layer (K, V), FlashInfer as one buffer per layer whose block is 2*block_size
"tokens" (K's then V's), MLA as one buffer per layer. A GPU cache in HND
order (heads before tokens inside a block) has no such plan: Unimplemented.

Head split (TP heterogeneity): with H kv heads over TP ranks, rank r holds
heads [r*H/TP, (r+1)*H/TP) when TP <= H, else the one head r*H//TP
(replicated). `plan` picks, for each decode rank, which prefill rank sends
which of its heads: the same pure function runs on both sides.
"""
import ctypes

import numpy as np

from .. import checks, errors

FLASH, FLASHINFER, MLA = "flash", "flashinfer", "mla"


def on_device(t):
    """Whether t (a torch tensor or a numpy array) is no host memory."""
    return not isinstance(t, np.ndarray) and getattr(getattr(t, "device", None), "type", "cpu") != "cpu"


def as_bytes_view(t):
    """A numpy uint8 view (shape + (element bytes,)) of a host tensor or
    array, sharing its memory. GPU tensors: InvalidArgument (a host view of
    device memory would crash the process; DeviceCaches takes them)."""
    if isinstance(t, np.ndarray):
        if t.dtype == np.uint8:
            return t[..., None]
        return t[..., None].view(np.uint8)
    if on_device(t):
        raise errors.InvalidArgument("kvfence.vllm: a %s tensor has no host view" % t.device.type)
    esize = int(t.element_size())
    shape = tuple(int(s) for s in t.shape) + (esize,)
    strides = tuple(int(s) * esize for s in t.stride()) + (1,)
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * span).from_address(int(t.data_ptr())))
    return np.lib.stride_tricks.as_strided(raw, shape=shape, strides=strides)


class LayerView:
    """One layer's cache as canonical blocks: block(b) is a view
    (kv, tokens, heads, head_bytes) of block b, whatever the strides."""

    def __init__(self, name, tensor, kind="auto"):
        v = as_bytes_view(tensor)
        self.name = name
        if kind == "auto":
            kind = guess_kind(v.shape[:-1])
        if kind == MLA:
            if v.ndim != 4:
                raise errors.InvalidArgument("kvfence.vllm: layer %s: MLA cache must be (blocks, block_size, latent), got %s" % (name, v.shape[:-1]))
            # (blocks, tokens, latent, esize) -> (blocks, 1, tokens, 1, latent bytes)
            self.blocks = _merge_last(v[:, None, :, None])
        else:
            if v.ndim != 6:
                raise errors.InvalidArgument("kvfence.vllm: layer %s: cache must be 5-dimensional for %s, got %s" % (name, kind, v.shape[:-1]))
            if kind == FLASH:
                v = v.transpose(1, 0, 2, 3, 4, 5)  # -> (blocks, kv, tokens, heads, head, esize)
            elif kind != FLASHINFER:
                raise errors.InvalidArgument("kvfence.vllm: unknown cache layout %r (flash, flashinfer, mla)" % kind)
            # (blocks, kv, tokens, heads, head bytes): a view; the copy out is C order
            self.blocks = _merge_last(v)
        self.kind = kind
        self.num_blocks, self.kv, self.block_size, self.heads, self.head_bytes = self.blocks.shape

    def shard_bytes(self, nheads):
        return self.kv * nheads * self.block_size * self.head_bytes


def _merge_last(v):
    """Merges the last two axes (head_size, element bytes) into bytes; a
    view where they are contiguous (always: a head's elements are)."""
    if v.strides[-2] != v.shape[-1] * v.strides[-1]:
        raise errors.InvalidArgument("kvfence.vllm: a head's elements are not contiguous (strides %s)" % (v.strides,))
    return np.lib.stride_tricks.as_strided(v, shape=v.shape[:-2] + (v.shape[-2] * v.shape[-1],),
                                           strides=v.strides[:-2] + (v.strides[-1],))


def guess_kind(shape):
    if len(shape) == 3:
        return MLA
    if len(shape) == 5:
        if shape[0] == 2 and shape[1] != 2:
            return FLASH
        if shape[1] == 2 and shape[0] != 2:
            return FLASHINFER
        raise errors.InvalidArgument("kvfence.vllm: cache shape %s is ambiguous: set kv_connector_extra_config "
                                     "{\"kv_layout\": \"flash\" or \"flashinfer\"}" % (shape,))
    raise errors.InvalidArgument("kvfence.vllm: cache shape %s is no vLLM layout this connector knows" % (shape,))


def heads_of(rank, tp, total):
    """Global kv heads rank holds: a contiguous slice, or one replicated head."""
    if tp <= total:
        if total % tp:
            raise errors.Unimplemented("kvfence.vllm: %d kv heads over TP %d do not split evenly" % (total, tp))
        n = total // tp
        return list(range(rank * n, (rank + 1) * n))
    if tp % total:
        raise errors.Unimplemented("kvfence.vllm: TP %d is no multiple of %d kv heads" % (tp, total))
    return [rank * total // tp]


def plan(decode_rank, decode_tp, prefill_tp, total_heads, mla):
    """[(prefill_rank, [its local head indices])] writing decode_rank's
    pages, in shard order; every writer sends the same number of heads."""
    if mla:
        return [(decode_rank % prefill_tp, [0])]
    want = heads_of(decode_rank, decode_tp, total_heads)
    out = []
    for g in want:
        holders = [p for p in range(prefill_tp) if g in heads_of(p, prefill_tp, total_heads)]
        p = holders[decode_rank % len(holders)]
        local = heads_of(p, prefill_tp, total_heads).index(g)
        if out and out[-1][0] == p:
            out[-1][1].append(local)
        else:
            out.append((p, [local]))
    sizes = {len(h) for _, h in out}
    if len(sizes) != 1 or len({p for p, _ in out}) != len(out):
        raise errors.Unimplemented("kvfence.vllm: decode rank %d's heads come unevenly from prefill TP %d" % (decode_rank, prefill_tp))
    return out


class DeviceLayer:
    """One layer's GPU cache, described from its shape and strides alone
    (never read): buffers [(address, bytes, bytes per block)] of the staged
    plan, and the same geometry fields as LayerView."""

    def __init__(self, name, t, kind="auto"):
        es = int(t.element_size())
        shape = tuple(int(n) for n in t.shape)
        st = tuple(int(x) * es for x in t.stride())
        addr = int(t.data_ptr())
        if min(st + (1,)) <= 0:
            raise errors.InvalidArgument("kvfence.vllm: layer %s: strides %s" % (name, t.stride()))
        checks.device_range(addr, es + sum((n - 1) * x for n, x in zip(shape, st)), "KV cache layer %s" % name)
        self.name = name
        self.kind = kind = guess_kind(shape) if kind == "auto" else kind
        if kind == MLA:
            if len(shape) != 3:
                raise errors.InvalidArgument("kvfence.vllm: layer %s: MLA cache must be (blocks, block_size, latent), got %s" % (name, shape))
            self.num_blocks, self.block_size, lat = shape
            self.kv, self.heads, self.head_bytes = 1, 1, lat * es
            _packed(name, shape, st, es)
            self.buffers, self.tokens_per_block = [(addr, self.num_blocks * st[0], st[0])], self.block_size
            return
        if len(shape) != 5 or kind not in (FLASH, FLASHINFER):
            raise errors.InvalidArgument("kvfence.vllm: layer %s: a %s cache of shape %s" % (name, kind, shape))
        nb, bs, h, hd = (shape[1], shape[2], shape[3], shape[4]) if kind == FLASH else (shape[0], shape[2], shape[3], shape[4])
        if st[2] < st[3] and h > 1:
            raise errors.Unimplemented("kvfence.vllm: layer %s: an HND cache in GPU memory (heads before tokens in a "
                                       "block) has no staged plan; use vLLM's NHD layout" % name)
        self.num_blocks, self.kv, self.block_size, self.heads, self.head_bytes = nb, 2, bs, h, hd * es
        item = bs * h * hd * es
        _packed(name, shape, st, es)
        if kind == FLASH:  # K's blocks, then V's
            self.buffers, self.tokens_per_block = [(addr, nb * item, item), (addr + st[0], nb * item, item)], bs
        else:  # per block K's block_size tokens then V's: one buffer of 2*block_size "tokens" per block
            self.buffers, self.tokens_per_block = [(addr, nb * 2 * item, 2 * item)], 2 * bs

    def shard_bytes(self, nheads):
        return self.kv * nheads * self.block_size * self.head_bytes


def _packed(name, shape, strides, es):
    """Refuses strides that are not C order over shape (padding, a view)."""
    want = es
    for n, s in zip(reversed(shape), reversed(strides)):
        if s != want and n != 1:  # a size-1 axis's stride is never used
            raise errors.InvalidArgument("kvfence.vllm: layer %s: GPU cache strides %s are not packed C order over %s"
                                         % (name, strides, shape))
        want *= n


def open_caches(kv_caches, kind="auto"):
    """Caches (host) or DeviceCaches (every layer in GPU memory)."""
    if not kv_caches:
        raise errors.InvalidArgument("kvfence.vllm: no KV caches registered")
    dev = {on_device(t) for t in kv_caches.values()}
    if len(dev) != 1:
        raise errors.InvalidArgument("kvfence.vllm: some KV cache layers in host memory, some on a device")
    return DeviceCaches(kv_caches, kind) if dev == {True} else Caches(kv_caches, kind)


class Caches:
    """Every registered layer of one worker (host memory), in a fixed order."""
    device = False
    layer_class = LayerView

    def __init__(self, kv_caches, kind="auto"):
        if not kv_caches:
            raise errors.InvalidArgument("kvfence.vllm: no KV caches registered")
        self.layers = [self.layer_class(n, t, kind) for n, t in sorted(kv_caches.items())]
        first = self.layers[0]
        for l in self.layers:
            if (l.kind, l.num_blocks, l.kv, l.heads, l.block_size, l.head_bytes) != (
                    first.kind, first.num_blocks, first.kv, first.heads, first.block_size, first.head_bytes):
                raise errors.Unimplemented("kvfence.vllm: layers of different shapes (%s vs %s): one KV cache group only" % (l.name, first.name))
        self.kind, self.mla = first.kind, first.kind == MLA
        self.num_blocks, self.heads, self.block_size = first.num_blocks, first.heads, first.block_size

    def shard_bytes(self, nheads):
        return sum(l.shard_bytes(nheads) for l in self.layers)

    def _check(self, block):
        if not 0 <= block < self.num_blocks:
            raise errors.InvalidArgument("kvfence.vllm: block %d outside the cache's %d blocks" % (block, self.num_blocks))

    def gather(self, block, heads, out):
        """Copies block's heads (local indices, consecutive) of every layer
        into out (a writable uint8 array of shard_bytes(len(heads)))."""
        self._check(block)
        h0, h1 = heads[0], heads[-1] + 1
        off = 0
        for l in self.layers:
            src = l.blocks[block, :, :, h0:h1]
            n = src.size
            out[off:off + n].reshape(src.shape)[...] = src
            off += n

    def scatter(self, block, heads, shard):
        """Writes a canonical shard (gather's bytes) into block's heads."""
        self._check(block)
        h0, h1 = heads[0], heads[-1] + 1
        off = 0
        for l in self.layers:
            dst = l.blocks[block, :, :, h0:h1]
            n = dst.size
            dst[...] = shard[off:off + n].reshape(dst.shape)
            off += n


class DeviceCaches(Caches):
    """Every registered layer of one worker in GPU memory: only the staged
    layout's description (staged_layout) and the head slice of a shard
    (slice_of); kvfence's Go side does every copy through the driver."""
    device = True
    layer_class = DeviceLayer

    def staged_layout(self):
        """(ptrs, lens, items, page_size) for kvfence.staging.Layout."""
        bufs = [b for l in self.layers for b in l.buffers]
        return [b[0] for b in bufs], [b[1] for b in bufs], [b[2] for b in bufs], self.layers[0].tokens_per_block

    def slice_of(self, heads):
        """(part, parts) of every token for local heads (consecutive): the
        staged plan splits a token's heads into equal parts."""
        n = len(heads)
        if self.mla:
            return 0, 1
        if heads != list(range(heads[0], heads[0] + n)) or self.heads % n or heads[0] % n:
            raise errors.Unimplemented("kvfence.vllm: heads %s of %d are no equal part of a GPU cache's token" % (heads, self.heads))
        return heads[0] // n, self.heads // n

    def gather(self, block, heads, out):
        raise errors.InvalidArgument("kvfence.vllm: a GPU cache is copied by the staged layout, not from host code")

    scatter = gather
