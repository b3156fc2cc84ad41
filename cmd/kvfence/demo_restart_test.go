package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/demo"
)

// The decode agent is killed with kill -9 while writes are in flight on the
// (delayed) data path, its TCP plugin dies with it, and a new decode
// instance starts on the same control address. The prefill ranks survive
// and relink. Every request in flight at the crash ends failed (the router
// never gets a handed outcome for it, and the new instance never hands off a
// request it did not admit); the prefill ranks' in-doubt batches to the
// dead instance are settled by receiver-closed evidence, so no rank keeps
// source pages or a batch in doubt; messages for the old instance are
// counted stale; requests on the new instance all hand off, with no corrupt
// page.
//
// Every data lane is delayed by 400 ms, and the kill comes once decode has
// handed a request off (the lanes are up) while a prefill rank has batches
// in flight: writes are then on the delayed path, whatever the machine's
// speed. The new instance starts 3 s after the kill, as on a loaded
// machine; the prefill ranks are frozen until it is ready (demo.RunDecodeRestart),
// so they still hold the dead instance's requests when they meet it.
func TestDemoDecodeRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "kvfence-restart-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("logs kept in %s", dir)
		} else {
			_ = os.RemoveAll(dir)
		}
	}()
	s, err := demo.RunDecodeRestart(ctx, demo.Options{Requests: 48, Concurrency: 24, MinPages: 4, MaxPages: 12,
		PageEvery: 5 * time.Millisecond, DecodeFor: 300 * time.Millisecond,
		Delays: []time.Duration{400 * time.Millisecond}, Fence: true, TLS: true,
		Dir: dir, Seed: 5, RestartDelay: 3 * time.Second, Exe: agentExe}, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *s)
	if s.InFlightAtCrash == 0 {
		t.Fatalf("no request was in flight when decode died: the run proves nothing")
	}
	if s.InDoubtAtPrefill == 0 {
		t.Fatalf("no prefill batch was left in doubt by the crash: the run proves nothing about quiescence")
	}
	if s.OrphanHanded != 0 {
		t.Fatalf("%d requests cut by the crash were later reported handed off", s.OrphanHanded)
	}
	if s.OldPlugins == 0 || s.OldPluginsGoneSec < 0 {
		t.Fatalf("the killed decode's plugin process did not die with it (%d children, gone after %.1fs)", s.OldPlugins, s.OldPluginsGoneSec)
	}
	if s.OldInstance == 0 || s.NewInstance == 0 || s.OldInstance == s.NewInstance {
		t.Fatalf("decode instances %d then %d: the restart must be a new instance", s.OldInstance, s.NewInstance)
	}
	if !s.PrefillAlive {
		t.Fatalf("a prefill rank died with the decode")
	}
	if s.SourceReleasedSec < 0 || s.PrefillHeldAtEnd != 0 || s.PrefillUnsettledAtEnd != 0 {
		t.Fatalf("prefill still holds %d requests' source pages and %d batches in doubt (released after %.1fs): a dead decode's writes never got quiescence evidence",
			s.PrefillHeldAtEnd, s.PrefillUnsettledAtEnd, s.SourceReleasedSec)
	}
	if s.QuiescedByEvidence["receiver-closed"] == 0 {
		t.Fatalf("no batch was settled by receiver-closed evidence: %v", s.QuiescedByEvidence)
	}
	for ev := range s.QuiescedByEvidence {
		if strings.Contains(ev, "process-exited") {
			t.Fatalf("a prefill plugin exited: %v", s.QuiescedByEvidence)
		}
	}
	if s.Stale == 0 {
		t.Fatalf("the new instance counted no stale message: the old instance's tags never reached it")
	}
	if s.After == 0 || s.HandedAfter != s.After || s.Handoffs != s.HandedAfter {
		t.Fatalf("after the restart: %d requests, %d handed (new instance handoffs %d)", s.After, s.HandedAfter, s.Handoffs)
	}
	if s.CorruptPages != 0 || s.FreeWrites != 0 {
		t.Fatalf("corrupt_pages = %d (free writes %d) after a decode restart, want 0", s.CorruptPages, s.FreeWrites)
	}
	if s.PagesVerified == 0 {
		t.Fatalf("nothing verified")
	}
	if s.Unreleased != 0 {
		t.Fatalf("%d exposures still held on the new instance", s.Unreleased)
	}
}
