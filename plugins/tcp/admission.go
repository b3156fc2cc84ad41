package tcp

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"golang.org/x/time/rate"
)

// This file: who gets a share of the data port (issue 19). The receiver
// cannot know its writers' certificates in advance (each transport makes an
// ephemeral one), so a TLS handshake alone proves only that the client holds
// some key. What the deployment did authorise is a grant: a session is
// opened only for a HELLO that names a key this receiver granted, not
// revoked, or a writer-bound key (revoked or not) bound to the identity the
// handshake proved. The granted key is the per-grant token; it travels only
// over the agents' authenticated control plane and inside TLS.
//
// Then the port's room is shared:
//   - a session must start its first write within FirstWriteTimeout (a
//     HELLO'd session that says nothing more is closed within seconds);
//   - one identity holds at most MaxSessionsPerWriter sessions at once;
//   - at MaxConns the oldest silent connection is evicted to make room, so
//     connections that say nothing cannot hold the port against one that
//     arrives later: first one that has not been admitted by a HELLO
//     (handshaking, or no HELLO yet), else a session that never wrote. A
//     writer admitted by its key is not evicted for a stranger.
//
// Unknown and revoked keys get one answer, at HELLO and on a write, so a
// guesser learns nothing about which keys ever existed; refusals are
// logged at most once a second (the counters in Stats keep every one).

// helloRefused is the HELLO_ACK code for a HELLO whose key is not usable
// here (unknown, revoked, or bound to another writer: one answer).
const helloRefused = 1

// admitted is one accepted connection: when it arrived, and its session
// once it has one. Guarded by receiver.mu (wrote is atomic: the session's
// goroutine sets it).
type admitted struct {
	since time.Time
	sess  *recvSession
}

// silent: it never started a write (still handshaking, or a session whose
// first write has not come).
func (a *admitted) silent() bool { return a.sess == nil || !a.sess.wrote.Load() }

// admitLocked makes room for a new connection: below MaxConns it is simply
// taken; at the cap the oldest silent connection is evicted for it, and
// without one the new connection is refused. Caller holds r.mu.
func (r *receiver) admitLocked(c net.Conn) bool {
	if len(r.conns) >= r.t.cfg.MaxConns {
		if r.t.cfg.unsafe == unsafeAdmitAny || !r.evictOldestSilentLocked() {
			return false
		}
	}
	r.conns[c] = &admitted{since: time.Now()}
	return true
}

// evictOldestSilentLocked closes the oldest connection not admitted by a
// HELLO, else the oldest session that never wrote; false when every
// connection has written. A session is ended by its abort (never a bare
// close, see recvSession), though a silent one has nothing to apply.
func (r *receiver) evictOldestSilentLocked() bool {
	var oldest, oldestSession net.Conn
	var at, atSession *admitted
	for c, a := range r.conns {
		switch {
		case a.sess == nil && (at == nil || a.since.Before(at.since)):
			oldest, at = c, a
		case a.sess != nil && a.silent() && (atSession == nil || a.since.Before(atSession.since)):
			oldestSession, atSession = c, a
		}
	}
	if at == nil {
		oldest, at = oldestSession, atSession
	}
	if at == nil {
		return false
	}
	delete(r.conns, oldest)
	r.t.stats.add(statSilentEvicted, 1)
	if at.sess != nil {
		at.sess.abort()
	} else {
		_ = oldest.Close()
	}
	return true
}

// helloAnyUsable reports whether a HELLO from peer naming keys may open a
// session: whether any of them may.
func (r *receiver) helloAnyUsable(peer fingerprint, keys []uint64) bool {
	for _, k := range keys {
		if r.helloUsable(peer, k) {
			return true
		}
	}
	return false
}

// helloUsable reports whether a HELLO from peer naming key may open a
// session: the key is granted here and not revoked, or it is bound to peer
// (revoked or not). One verdict for every refusal.
//
// A writer-bound key opens a session for its own writer even once revoked:
// admission asks whether the deployment authorised this identity, and the
// grant did; writes under the key stay refused. Refusing it made a writer
// whose new session started with a batch of a request aborted meanwhile
// (decode revokes at the abort) dial again — seconds on a slow link — for
// the other requests' batches queued behind it. The writer already knows
// the key was granted, so the answer tells it nothing; anyone else gets the
// one answer.
func (r *receiver) helloUsable(peer fingerprint, key uint64) bool {
	if r.t.cfg.unsafe == unsafeAdmitAny {
		return true // KNOWN-UNSAFE: anyone who completes a handshake
	}
	r.t.mu.Lock()
	e := r.t.keys[sdk.Key(key)]
	r.t.mu.Unlock()
	if e == nil {
		return false
	}
	if e.writer != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.present[peer] == e.writer
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.revoked
}

// joinLocked registers s under its connection and its identity's presence,
// refusing an identity already holding MaxSessionsPerWriter sessions.
// Caller holds r.mu.
func (r *receiver) joinLocked(s *recvSession) bool {
	at := r.present[s.peer]
	if at != nil && at.live >= r.t.cfg.MaxSessionsPerWriter && r.t.cfg.unsafe != unsafeAdmitAny {
		return false
	}
	if at == nil {
		at = &presence{}
		r.present[s.peer] = at
	}
	at.live++
	r.t.stats.max(statMostSessionsPerWriter, uint64(at.live))
	s.at = at
	r.sessions[s.token] = s
	if a := r.conns[s.raw]; a != nil {
		a.sess = s
	}
	return true
}

// firstWriteDeadline is when a session that has not written yet is closed.
func (r *receiver) firstWriteDeadline(s *recvSession) time.Time {
	if s.wrote.Load() || r.t.cfg.unsafe == unsafeAdmitAny {
		return time.Now().Add(r.t.cfg.IdleTimeout)
	}
	return time.Now().Add(r.t.cfg.FirstWriteTimeout)
}

// oneAnswer is the code a write under an unknown key gets: the revoked
// one, so that the two cannot be told apart.
func oneAnswer(c ackCode) ackCode {
	if c == ackUnknownKey {
		return ackRevoked
	}
	return c
}

// refusalLog logs at most once per interval; Stats count every event.
type refusalLog struct{ every rate.Sometimes }

func newRefusalLog() *refusalLog { return &refusalLog{every: rate.Sometimes{Interval: time.Second}} }

// warn logs msg unless a refusal was logged within the last second.
func (l *refusalLog) warn(r *receiver, msg string, args ...any) {
	l.every.Do(func() { r.log.Warn(msg+" (logged at most once a second; see Stats)", args...) })
}

// wroteFlag is embedded in recvSession: set once its first write arrives.
type wroteFlag struct{ wrote atomic.Bool }
