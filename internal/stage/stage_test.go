package stage

import (
	"bytes"
	"testing"
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
)

// engine is a fake KV pool: nbuf buffers of pages items of item bytes.
type engine struct {
	mem  [][]byte
	item int64
}

func newEngine(nbuf, pages int, item int64, fill byte) *engine {
	e := &engine{item: item}
	for b := 0; b < nbuf; b++ {
		m := make([]byte, int64(pages)*item)
		for i := range m {
			m[i] = fill + byte(b*7) + byte(i*31) + byte(i>>9)
		}
		e.mem = append(e.mem, m)
	}
	return e
}

func (e *engine) layout(t testing.TB, pageSize int) *Layout {
	var bufs []Buffer
	for _, m := range e.mem {
		bufs = append(bufs, Buffer{Addr: unsafe.Pointer(&m[0]), Len: int64(len(m)), Item: e.item})
	}
	l, err := NewLayout(bufs, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// token is the bytes of token t (of pageSize) of page idx in buffer b.
func (e *engine) token(b int, idx int32, t, pageSize int) []byte {
	tok := e.item / int64(pageSize)
	off := int64(idx)*e.item + int64(t)*tok
	return e.mem[b][off : off+tok]
}

// TestPrefillTPOverDecodeTP: S prefill ranks each hold 1/S of decode's
// heads; each gathers its whole pages into its shard of a slot and decode
// scatters them: every decode token is the S ranks' slices in rank order.
func TestPrefillTPOverDecodeTP(t *testing.T) {
	for _, ps := range []int{1, 4} {
		const shards, nbuf, pages = 4, 3, 16
		tokD := int64(64)
		var prefill []*engine
		for k := 0; k < shards; k++ {
			prefill = append(prefill, newEngine(nbuf, pages, tokD/shards*int64(ps), byte(k*50)))
		}
		dec := newEngine(nbuf, pages, tokD*int64(ps), 0)
		src, dst := []int32{3, 4, 9}, []int32{7, 1, 2}
		shardB := prefill[0].layout(t, ps).ShardBytes(Slice{0, 1})
		slots := make([]byte, int64(len(src))*shardB*shards)
		for k, pe := range prefill {
			l := pe.layout(t, ps)
			for n, idx := range src {
				var runs []Run
				runs = l.GatherPage(runs, idx, Slice{0, 1}, unsafe.Pointer(&slots[(int64(n)*shards+int64(k))*shardB]))
				if err := (Host{}).Copy(runs); err != nil {
					t.Fatal(err)
				}
			}
		}
		dl := dec.layout(t, ps)
		for n, idx := range dst {
			runs := dl.ScatterPage(nil, unsafe.Pointer(&slots[int64(n)*shards*shardB]), shards, shardB, false, idx)
			if err := (Host{}).Copy(runs); err != nil {
				t.Fatal(err)
			}
		}
		for n := range dst {
			for b := 0; b < nbuf; b++ {
				for tk := 0; tk < ps; tk++ {
					var want []byte
					for k := 0; k < shards; k++ {
						want = append(want, prefill[k].token(b, src[n], tk, ps)...)
					}
					if got := dec.token(b, dst[n], tk, ps); !bytes.Equal(got, want) {
						t.Fatalf("page size %d, page %d buffer %d token %d: heads misplaced", ps, n, b, tk)
					}
				}
			}
		}
	}
}

// TestDecodeTPOverPrefillTP: one prefill rank holds D decode ranks' heads;
// decode rank d takes slice {d, D} (SGLang's contiguous split).
func TestDecodeTPOverPrefillTP(t *testing.T) {
	const D, nbuf, pages, ps = 2, 2, 8, 2
	pre := newEngine(nbuf, pages, 32*ps, 9)
	pl := pre.layout(t, ps)
	for d := 0; d < D; d++ {
		dec := newEngine(nbuf, pages, 32/D*ps, 0)
		s := Slice{Part: d, Parts: D}
		if err := pl.Check(s); err != nil {
			t.Fatal(err)
		}
		shard := make([]byte, pl.ShardBytes(s))
		if err := (Host{}).Copy(pl.GatherPage(nil, 5, s, unsafe.Pointer(&shard[0]))); err != nil {
			t.Fatal(err)
		}
		dl := dec.layout(t, ps)
		if err := (Host{}).Copy(dl.ScatterPage(nil, unsafe.Pointer(&shard[0]), 1, int64(len(shard)), false, 6)); err != nil {
			t.Fatal(err)
		}
		for b := 0; b < nbuf; b++ {
			for tk := 0; tk < ps; tk++ {
				whole := pre.token(b, 5, tk, ps)
				want := whole[d*len(whole)/D : (d+1)*len(whole)/D]
				if !bytes.Equal(dec.token(b, 6, tk, ps), want) {
					t.Fatalf("decode rank %d buffer %d token %d: wrong heads", d, b, tk)
				}
			}
		}
	}
}

// TestMLATakesShardZero: with MLA every rank writes the whole latent.
func TestMLATakesShardZero(t *testing.T) {
	dec := newEngine(2, 4, 48, 0)
	dl := dec.layout(t, 1)
	slot := make([]byte, 2*96)
	for i := range slot {
		slot[i] = byte(i)
	}
	if err := (Host{}).Copy(dl.ScatterPage(nil, unsafe.Pointer(&slot[0]), 2, 96, true, 3)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dec.mem[0][3*48:4*48], slot[:48]) || !bytes.Equal(dec.mem[1][3*48:4*48], slot[48:96]) {
		t.Fatal("MLA page not shard 0")
	}
}

func TestRunsMerge(t *testing.T) {
	e := newEngine(1, 8, 64, 0)
	l := e.layout(t, 4)
	dst := make([]byte, 64)
	if runs := l.GatherPage(nil, 2, Slice{0, 1}, unsafe.Pointer(&dst[0])); len(runs) != 1 || runs[0].N != 64 {
		t.Fatalf("a whole page is one run, got %d runs", len(runs))
	}
}

func TestRefusals(t *testing.T) {
	e := newEngine(1, 8, 60, 0)
	if _, err := NewLayout(nil, 1); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("empty layout: %v", err)
	}
	if _, err := NewLayout([]Buffer{{Addr: unsafe.Pointer(&e.mem[0][0]), Len: 480, Item: 60}}, 8); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("item not whole tokens: %v", err)
	}
	l := e.layout(t, 1)
	if err := l.CheckIndices([]int32{7}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]int32{{8}, {-1}} {
		if err := l.CheckIndices(bad); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("index %v: %v", bad, err)
		}
	}
	if err := l.Check(Slice{0, 7}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("60 bytes in 7 parts: %v", err)
	}
	if err := l.Check(Slice{2, 2}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("part 2 of 2: %v", err)
	}
}

// GatherPages (buffer by buffer), copied span by span with CopySpan, puts
// the same bytes in every shard as GatherPage page by page, for whole pages
// and a head slice, page sizes 1 and 4; a wrong offset in either plan or a
// span edge skipped or copied twice shows as a differing byte.
func TestGatherPagesMatchesGatherPage(t *testing.T) {
	for _, ps := range []int{1, 4} {
		for _, s := range []Slice{{0, 1}, {1, 2}} {
			e := newEngine(5, 16, 64*int64(ps), 3)
			l := e.layout(t, ps)
			idx := []int32{9, 2, 15, 3, 4, 0, 11}
			shard := l.ShardBytes(s)
			want, got := make([]byte, shard*int64(len(idx))), make([]byte, shard*int64(len(idx)))
			var dst []unsafe.Pointer
			for n, i := range idx {
				if err := (Host{}).Copy(l.GatherPage(nil, i, s, unsafe.Pointer(&want[int64(n)*shard]))); err != nil {
					t.Fatal(err)
				}
				dst = append(dst, unsafe.Pointer(&got[int64(n)*shard]))
			}
			runs := l.GatherPages(nil, idx, s, dst)
			for at := 0; at < len(runs); at += 3 {
				Host{}.CopySpan(runs, at, min(at+3, len(runs)))
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("page size %d, slice %v: GatherPages' bytes differ from GatherPage's", ps, s)
			}
		}
	}
}
