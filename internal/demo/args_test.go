package demo

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/sdk"
)

func TestPerHostAdvertisesOneEndpointPerHost(t *testing.T) {
	ep := sdk.Endpoint{Transport: "verbs", Address: "[::]:4791", Opaque: []byte{1}}
	got := perHost(ep, []string{"127.0.0.1", "127.0.0.2"}, hclog.NewNullLogger())
	if len(got) != 2 || got[0].Address != "127.0.0.1:4791" || got[1].Address != "127.0.0.2:4791" ||
		got[1].Transport != "verbs" || len(got[1].Opaque) != 1 {
		t.Fatalf("perHost: %+v", got)
	}
	if got := perHost(sdk.Endpoint{Address: "no-port"}, []string{"h"}, hclog.NewNullLogger()); got != nil {
		t.Fatalf("an address without a port must be advertised as is: %+v", got)
	}
}

func TestDemoPluginArgs(t *testing.T) {
	if a := (Options{}).PluginArgs([]string{"K=V"}); a != nil {
		t.Fatalf("no plugin: %v", a)
	}
	o := Options{Plugin: "/usr/bin/kvfence-plugin-verbs"}
	want := []string{"--plugin", "/usr/bin/kvfence-plugin-verbs", "--plugin-env", "A=1", "--plugin-env", "B=2"}
	if a := o.PluginArgs([]string{"A=1", "B=2"}); !reflect.DeepEqual(a, want) {
		t.Fatalf("pluginArgs: %v", a)
	}
}

// The decode rank's command line: the delaying proxy only on the embedded
// TCP plugin and never under the restart fence, whose instances announce
// their own endpoints.
func TestDecodeArgs(t *testing.T) {
	delays := []time.Duration{600 * time.Millisecond, time.Millisecond}
	cases := []struct {
		name     string
		o        Options
		want     []string
		wantNone []string
	}{
		{"tcp", Options{Delays: delays, Fence: true}, []string{"--fence=true", "--slots=4096", "--data-delay 600ms,1ms"}, []string{"--restart-fence", "--plugin"}},
		{"plugin", Options{Delays: delays, Plugin: "/p", DecodeEnv: []string{"A=1"}, Slots: 64}, []string{"--slots=64", "--plugin /p --plugin-env A=1"}, []string{"--data-delay"}},
		{"restart fence", Options{Delays: delays, RestartInstances: 2, RestartAfter: time.Second}, []string{"--restart-fence-instances=2", "--restart-fence-after=1s"}, []string{"--data-delay"}},
		{"hosts", Options{DataHosts: []string{"a", "b"}}, []string{"--advertise-hosts a,b"}, nil},
	}
	for _, c := range cases {
		line := strings.Join(decodeArgs(c.o, commonArgs(c.o)), " ")
		for _, w := range c.want {
			if !strings.Contains(line, w) {
				t.Errorf("%s: %q lacks %q", c.name, line, w)
			}
		}
		for _, w := range c.wantNone {
			if strings.Contains(line, w) {
				t.Errorf("%s: %q has %q", c.name, line, w)
			}
		}
	}
	if got := commonArgs(Options{Unsafe: "release-on-abort", Checksums: true, AgentArgs: []string{"--lease=5s"}}); !reflect.DeepEqual(got,
		[]string{"--unsafe", "release-on-abort", "--checksums", "--lease=5s"}) {
		t.Fatalf("commonArgs: %v", got)
	}
}

// The plans are the seed's: the same seed gives the same run, pages stay
// in bounds, and a cancel falls within the request's transfer window.
func TestMakePlans(t *testing.T) {
	o := Options{Requests: 500, MinPages: 3, MaxPages: 7, AbortShare: 0.5, PageEvery: time.Millisecond,
		Delays: []time.Duration{10 * time.Millisecond}, Seed: 9}
	a, b := makePlans(o), makePlans(o)
	if !reflect.DeepEqual(a, b) || len(a) != o.Requests+1 {
		t.Fatalf("plans differ for one seed, or wrong length %d", len(a))
	}
	aborted := 0
	for _, p := range a[1:] {
		if p.pages < o.MinPages || p.pages > o.MaxPages {
			t.Fatalf("pages %d outside [%d, %d]", p.pages, o.MinPages, o.MaxPages)
		}
		if p.abortAt >= 0 {
			aborted++
			if p.abortAt > time.Duration(p.pages)*o.PageEvery+10*time.Millisecond {
				t.Fatalf("cancel at %v, after the transfer window", p.abortAt)
			}
		}
	}
	if aborted < 150 || aborted > 350 {
		t.Fatalf("%d of 500 cancelled with share 0.5", aborted)
	}
	o.Seed = 10
	if reflect.DeepEqual(makePlans(o), a) {
		t.Fatalf("another seed gave the same plans")
	}
}

// feed runs every job once, and none after cut.
func TestFeed(t *testing.T) {
	var mu = make(chan struct{}, 1)
	seen := map[int]int{}
	feed(t.Context(), 4, 100, nil, func(i int) {
		mu <- struct{}{}
		seen[i]++
		<-mu
	})
	if len(seen) != 100 {
		t.Fatalf("%d of 100 jobs ran", len(seen))
	}
	for i, n := range seen {
		if n != 1 {
			t.Fatalf("job %d ran %d times", i, n)
		}
	}
	cut := make(chan struct{})
	ran := 0
	feed(t.Context(), 1, 100, cut, func(i int) {
		ran++
		if i == 4 {
			close(cut)
		}
	})
	if ran > 6 {
		t.Fatalf("%d jobs ran after the cut at job 4", ran)
	}
}

// counts: a request that did not hand off failed, and is lost unless the
// router cancelled it; a wave counts each outcome in its own column.
func TestCountsAndWaveOutcomes(t *testing.T) {
	c := &counts{}
	c.end(outHanded, true, time.Millisecond)
	c.end(outFailed, true, time.Millisecond)
	c.end(outFailed, false, time.Millisecond)
	c.end(outCut, false, time.Millisecond)
	if c.handed.Load() != 1 || c.failed.Load() != 3 || c.lost.Load() != 2 || c.done.Load() != 4 || c.latSum != 4*time.Millisecond {
		t.Fatalf("handed %d failed %d lost %d done %d latency %v", c.handed.Load(), c.failed.Load(), c.lost.Load(), c.done.Load(), c.latSum)
	}
	var w waveResult
	for _, o := range []outcome{outHanded, outCut, outCut, outFailed, outGone} {
		w.count(o)
	}
	if w.handed != 1 || w.cut != 2 || w.failed != 2 {
		t.Fatalf("wave: %+v", w)
	}
}

// rooms: an outcome reaches the request waiting for its room; a handoff
// for a room already cut is counted an orphan.
func TestRoomsRouteOutcomes(t *testing.T) {
	done := make(chan Event)
	r := watchRooms(done)
	ch := r.wait(7)
	done <- Event{Room: 7, Done: &RequestOutcome{Handed: true}}
	if ev := <-ch; ev.Room != 7 {
		t.Fatalf("got room %d", ev.Room)
	}
	r.end(7, true)
	done <- Event{Room: 7, Done: &RequestOutcome{Handed: true}}
	done <- Event{Room: 8, Done: &RequestOutcome{Handed: true}} // never waited for, not cut
	close(done)
	for deadline := time.Now().Add(10 * time.Second); r.orphans() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("orphans = %d, want 1", r.orphans())
		}
	}
}

func TestSummarize(t *testing.T) {
	c := &counts{elapsed: 2 * time.Second, latSum: 10 * time.Second}
	c.handed.Store(8)
	o := Options{Requests: 10, Concurrency: 5, RestartInstances: 2}
	s := summarize(o, c, statsForTest())
	if s.Variant != "safe" || s.Handoffs != 8 || s.RequestsPerSec != 5 || s.MeanLatencyMs != 1000 || s.SteadyRequestsPerSec != 5 ||
		s.PoolSlots != DefaultSlots || s.FailedPerRestart != 1.5 || s.HoldP50Ms["drained"] != 2 || s.HoldP99Ms["drained"] != 2 {
		t.Fatalf("%+v", *s)
	}
	if Quantile(nil, 0.5) != 0 || Quantile([]float64{3, 1, 2}, 0.5) != 2 {
		t.Fatalf("Quantile")
	}
}

func statsForTest() agent.DecodeStats {
	var st agent.DecodeStats
	st.TargetRestarts = 2
	st.Core.RestartFailed = 3
	st.HoldsMs = map[string][]float64{"drained": {1, 3, 2}}
	return st
}
