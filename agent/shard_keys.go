package agent

import (
	"context"
	"errors"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// This file: keys bound to shard positions (issue 19 item 2). A slot holds
// one shard per tensor-parallel prefill rank; the rank at position pos of
// an exposure writes only shardRange(pos) of each slot. With a fence,
// decode grants each rank keys over its own shards only, so a co-rank
// holding any of them cannot write another rank's shard — on its first
// request too, and whichever keys it holds:
//
//   - bounds pieces: one key per rank per run of consecutive slots, a
//     pieced window (sdk.Window.Stride = slot, Piece = shard);
//   - bounds window: one key per rank per slot, over its shard alone;
//   - bounds none (the transport does not confine writes to a key's
//     window, or there is no fence): nothing can bind a key to a shard;
//     keys cover whole slots and each rank is told its shard's offset
//     (DecodeConfig.RequireShardKeys refuses to start instead).
//
// keyRef.Base is where the rank's own shard of the page is under the key
// (control protocol v2): prefill writes exactly there.

// shardRange is the rank at position pos's bytes in every slot.
func (d *Decode) shardRange(pos int) (off, n int64) {
	return int64(pos) * d.cfg.ShardBytes, d.cfg.ShardBytes
}

// layout is one registered region the slots live in: the pool, or one of
// the engine's buffers in direct mode (direct_layers.go), where a slot
// (engine page) is slotB bytes and each rank's shard of it shardB.
type layout struct {
	region        sdk.RegionID
	slotB, shardB int64
}

// chooseShardKeys says how this decode rank binds keys to shard positions
// (at start): as far as its transport enforces, or as the test override.
func (d *Decode) chooseShardKeys() (sdk.Bounds, error) {
	b := d.info.Capabilities.Bounds
	if d.cfg.keyBounds != nil {
		b = min(b, *d.cfg.keyBounds)
	}
	if !d.fence || d.restartFenced() {
		b = sdk.BoundsNone // one pool key per instance: nothing to bind
	}
	if b == sdk.BoundsNone && d.cfg.RequireShardKeys {
		return b, errdefs.Errorf(errdefs.FailedPrecondition,
			"decode: shard keys required, but keys cannot be bound to shard positions here (bound as %s: fence %v, restart fence %v, transport %q declares bounds %s)",
			b,
			d.fence, d.restartFenced(), d.info.Name, d.info.Capabilities.Bounds)
	}
	return b, nil
}

// pageKey is where page i of an exposure is under one of the windows
// rankWindows returns: the window's index and the page's base in it.
type pageKey struct {
	win  int
	base uint64
}

// rankWindows are the windows that give the rank at pos its shards of
// slots (under d.shardKeys), and where each page is under them. With
// bounds none they are whole runs of slots, the same for every rank, and
// the bases are those of position 0.
func (d *Decode) rankWindows(slots []uint32, pos int) ([]sdk.Window, []pageKey) {
	return d.rankWindowsIn(layout{d.region, d.slotB, d.cfg.ShardBytes}, slots, pos)
}

// rankWindowsIn is rankWindows over one layout.
func (d *Decode) rankWindowsIn(lay layout, slots []uint32, pos int) ([]sdk.Window, []pageKey) {
	off, n := int64(pos)*lay.shardB, lay.shardB
	pages := make([]pageKey, len(slots))
	var ws []sdk.Window
	if d.shardKeys == sdk.BoundsWindow {
		for i, s := range slots {
			ws = append(ws, sdk.Window{Region: lay.region, Offset: uint64(int64(s)*lay.slotB + off), Length: uint64(n)})
			pages[i] = pageKey{win: i}
		}
		return ws, pages
	}
	for _, r := range slotRuns(slots) {
		w := sdk.Window{Region: lay.region, Offset: uint64(int64(slots[r.first]) * lay.slotB), Length: uint64(int64(r.n) * lay.slotB)}
		if d.shardKeys == sdk.BoundsPieces {
			w.Offset += uint64(off)
			w.Length = uint64(int64(r.n-1)*lay.slotB + n)
			w.Stride, w.Piece = uint64(lay.slotB), uint64(n)
		}
		for p := 0; p < r.n; p++ {
			pages[r.first+p] = pageKey{win: len(ws), base: uint64(int64(p) * lay.slotB)}
		}
		ws = append(ws, w)
	}
	return ws, pages
}

// grantReq is one set of windows decode grants for an exposure: a rank's
// own keys (shared false) or the keys every rank shares at its shard's
// offset (shared true, writer ""). grantAll fills refs and err.
type grantReq struct {
	rank   core.RankID
	pos    int
	writer string // "" = any holder
	shared bool
	ws     []sdk.Window
	pages  []pageKey
	refs   []keyRef
	err    error
}

// rankReq is the rank at pos's own keys, for writer. With bounds none the
// windows are whole slots and its pages sit at its shard's offset.
func (d *Decode) rankReq(dt *decTag, pos int, writer string) *grantReq {
	ws, pages := d.pageWindows(dt.slots, pos, d.shardKeys == sdk.BoundsNone)
	return &grantReq{rank: dt.ranks[pos], pos: pos, writer: writer, ws: ws, pages: pages}
}

// sharedReq is the keys of ranks without keys of their own.
func (d *Decode) sharedReq(dt *decTag) *grantReq {
	ws, pages := d.pageWindows(dt.slots, 0, false)
	return &grantReq{shared: true, ws: ws, pages: pages}
}

// grantJob is one exposure's grant call: its requests, for an exposure of
// these slots; keys is every key granted, to be revoked even when its request
// failed.
type grantJob struct {
	dt     *decTag
	reqs   []*grantReq
	shared bool
	slots  []uint32
	keys   []sdk.Key
	// fallback is the shared keys' request for writers not connected yet
	// under bounds none (planned in the loop, granted only if needed).
	fallback *grantReq
	// retried: grantUnbound ran, and retry is what it granted again (its
	// keys are in keys too), so the loop makes no call of its own.
	retried bool
	retry   []*grantReq
}

// grantAll grants the windows of every request in one call and fills each
// request's refs and err; it returns every key granted.
func (d *Decode) grantAll(slots []uint32, reqs []*grantReq) []sdk.Key {
	j := &grantJob{reqs: reqs, slots: slots}
	d.grantMany([]*grantJob{j})
	return j.keys
}

// grantMany grants the windows of every job in one call (sdk.GrantKeys:
// one RPC where the plugin takes batches, else one per window in
// parallel) and fills each job. It touches no loop state: the grant queue
// runs it off the loop (async_grant.go).
func (d *Decode) grantMany(jobs []*grantJob) {
	var ws []sdk.Window
	for _, j := range jobs {
		for _, r := range j.reqs {
			for _, w := range r.ws {
				w.Writer = r.writer
				ws = append(ws, w)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d.keyCalls.Add(1)
	got := sdk.GrantKeys(ctx, d.granter, ws)
	for _, j := range jobs {
		got = d.takeGranted(j, got)
	}
}

// takeGranted fills job j's requests from the first answers of got and
// returns the rest.
func (d *Decode) takeGranted(j *grantJob, got []sdk.Granted) []sdk.Granted {
	for _, r := range j.reqs {
		keys := make([]sdk.Key, len(r.ws))
		var errs []error
		for i := range r.ws {
			g := got[0]
			got = got[1:]
			if g.Err != nil {
				errs = append(errs, g.Err)
				continue
			}
			keys[i] = g.Key
			j.keys = append(j.keys, g.Key)
		}
		r.err = errors.Join(errs...)
		refs := make([]keyRef, len(r.pages))
		for i, p := range r.pages {
			refs[i] = keyRef{Key: uint64(keys[p.win]), Base: p.base}
		}
		r.refs = d.joinLayers(refs, j.slots)
	}
	return got
}

// grantFenced makes an exposure's per-exposure keys in the loop (the
// synchronous form of grantAsync; tests).
func (d *Decode) grantFenced(dt *decTag) error {
	reqs, shared := d.planGrants(dt)
	dt.granted = append(dt.granted, d.grantAll(dt.slots, reqs)...)
	return d.finishGrants(dt, &grantJob{reqs: reqs, shared: shared})
}

// planGrants is an exposure's first grant call (loop only): each rank its
// own keys, over its shards, bound to its data identity where the
// transport can; a rank that announces no identity to a transport that
// binds writers gets none. Every rank's keys go in one grant call; a
// second one is needed only for writers not connected yet (finishGrants).
func (d *Decode) planGrants(dt *decTag) (reqs []*grantReq, shared bool) {
	dt.rankKeys = map[core.RankID][]keyRef{}
	for pos, rank := range dt.ranks {
		writer := ""
		if l := d.links[rank]; l != nil && d.bindWriters {
			writer = l.peer.Writer
		}
		switch {
		case d.bindWriters && writer == "":
			d.stats.NoWriterKeys++
			d.log.Warn("rank announces no data identity: no keys for it", "tag", dt.tag, "rank", rank)
			dt.rankKeys[rank] = nil // refused: not the shared keys either
			continue
		case d.shardKeys == sdk.BoundsNone && writer == "":
			shared = true
			continue
		}
		reqs = append(reqs, d.rankReq(dt, pos, writer))
	}
	if shared {
		reqs = append(reqs, d.sharedReq(dt))
	}
	return reqs, shared
}

// finishGrants stores what job j's grant calls made (loop only). For
// writers not connected to our transport yet it takes the keys
// grantUnbound made off the loop, or (the synchronous path) grants them
// here.
func (d *Decode) finishGrants(dt *decTag, j *grantJob) error {
	retry, needShared, err := d.takeGrants(dt, j.reqs)
	if err != nil {
		return err
	}
	if needShared && !j.shared {
		retry = append(retry, d.sharedReq(dt))
	}
	switch {
	case len(retry) == 0:
		return nil
	case j.retried:
		retry = j.retry // granted already; its keys are in dt.granted
	default:
		dt.granted = append(dt.granted, d.grantAll(dt.slots, retry)...)
	}
	_, _, err = d.takeGrants(dt, retry) // unbound: nothing left to retry
	return err
}

// writerNotConnected: r asked keys bound to a writer that has no data
// connection to our transport yet (a rank's first requests).
func writerNotConnected(r *grantReq) bool {
	return r.writer != "" && errdefs.Is(r.err, errdefs.FailedPrecondition)
}

// unboundReq is r again, for any holder: still over r's shards only.
func unboundReq(r *grantReq) *grantReq {
	return &grantReq{rank: r.rank, pos: r.pos, ws: r.ws, pages: r.pages}
}

// grantUnbound grants again, in one call for every job of a batch, what
// the first call refused because the writer is not connected yet, and
// keeps it in the job for the loop (finishGrants). It runs off the loop,
// after grantMany, and touches no loop state. In the loop this was one
// round trip per exposure, and at start-up (every admission before a
// rank's first data connection: a whole burst) each held every other
// admission behind it.
func (d *Decode) grantUnbound(jobs []*grantJob) {
	var again []*grantJob
	var of []*grantJob
	for _, j := range jobs {
		var retry []*grantReq
		needShared := false
		for _, r := range j.reqs {
			switch {
			case !writerNotConnected(r):
			case d.shardKeys == sdk.BoundsNone:
				needShared = true
			default:
				retry = append(retry, unboundReq(r))
			}
		}
		if needShared && !j.shared {
			if j.fallback == nil {
				continue // not planned: the loop grants it (finishGrants)
			}
			retry = append(retry, j.fallback)
		}
		j.retried, j.retry = true, retry
		if len(retry) > 0 {
			again = append(again, &grantJob{reqs: retry, slots: j.slots})
			of = append(of, j)
		}
	}
	if len(again) == 0 {
		return
	}
	d.grantMany(again)
	for i, a := range again {
		of[i].keys = append(of[i].keys, a.keys...)
	}
}

// takeGrants stores what grantAll made. A writer not connected to our
// transport yet (its first request) is retried with keys unbound to its
// identity — but still over its shards only; with bounds none it gets the
// shared keys instead (needShared).
func (d *Decode) takeGrants(dt *decTag, reqs []*grantReq) (retry []*grantReq, needShared bool, err error) {
	var errs []error
	for _, r := range reqs {
		switch {
		case writerNotConnected(r):
			d.log.Debug("writer not connected: keys not bound to its identity", "tag", dt.tag, "rank", r.rank, "error", r.err)
			if d.shardKeys == sdk.BoundsNone {
				needShared = true
				continue
			}
			retry = append(retry, unboundReq(r))
		case r.err != nil:
			errs = append(errs, r.err)
		case r.shared:
			dt.keys = r.refs
			d.stats.UnboundGrants++
		default:
			dt.rankKeys[r.rank] = r.refs
			if r.writer != "" {
				d.stats.BoundGrants++
			} else {
				d.stats.UnboundGrants++
			}
		}
	}
	return retry, needShared, errors.Join(errs...)
}

// keysFor is what the Assign to rank carries: its own keys, or the shared
// ones at its shard's offset; none for a rank refused keys.
func (dt *decTag) keysFor(d *Decode, rank core.RankID) []keyRef {
	if k, ok := dt.rankKeys[rank]; ok {
		return k
	}
	pos := -1
	for i, r := range dt.ranks {
		if r == rank {
			pos = i
		}
	}
	if dt.keys == nil || pos < 0 {
		return nil
	}
	out := make([]keyRef, len(dt.keys))
	for i, k := range dt.keys {
		out[i] = d.shiftToShard(k, pos)
	}
	return out
}
