package demo

import (
	"strings"
	"testing"
)

func TestCheckHolds(t *testing.T) {
	const (
		start   = `{"@message":"hold start","tag":"9/1/1","ranks":"1,2","evidence":"2:commit"}`
		ack1    = `{"@message":"hold evidence","tag":"9/1/1","rank":1,"kind":"drain-ack"}`
		drained = `{"@message":"hold release","tag":"9/1/1","path":"drained","held_ms":12.5}`
		fenced  = `{"@message":"hold release","tag":"9/1/1","path":"fenced","held_ms":900}`
		fence   = `{"@message":"hold fence","tag":"9/1/1"}`
		timeout = `{"@message":"hold release","tag":"9/1/1","path":"timeout","held_ms":3600}`
		unsafe  = `{"@message":"hold release","tag":"9/1/1","path":"unsafe","held_ms":0}`
	)
	cases := []struct {
		name string
		log  []string
		ok   bool
	}{
		{"drained", []string{"not json", start, ack1, drained}, true},
		{"fenced", []string{start, fence, fenced}, true},
		{"drained without rank 1", []string{start, drained}, false},
		{"fenced before fence", []string{start, fenced, fence}, false},
		{"timeout", []string{start, timeout}, false},
		{"unsafe", []string{start, unsafe}, false},
		{"never released", []string{start, ack1}, false},
		{"release without start", []string{drained}, false},
		{"released twice", []string{start, ack1, drained, drained}, false},
	}
	for _, c := range cases {
		rep, err := CheckHolds(strings.NewReader(strings.Join(c.log, "\n")), HoldCheckOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK != c.ok {
			t.Errorf("%s: ok=%v, want %v (%v)", c.name, rep.OK, c.ok, rep.Violations)
		}
	}
	rep, _ := CheckHolds(strings.NewReader(start+"\n"+timeout), HoldCheckOptions{AllowTimeout: true})
	if !rep.OK || rep.Released["timeout"] != 1 || rep.HeldP50Ms["timeout"] != 3600 {
		t.Errorf("allowed timeout: %+v", rep)
	}
}
