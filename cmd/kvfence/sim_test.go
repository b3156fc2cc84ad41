package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestSimJSON: `kvfence sim --json` prints one object with every variant by
// its stable name; the real core is clean and release-on-abort is caught.
func TestSimJSON(t *testing.T) {
	cmd := newSimCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--seeds", "40", "--json"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var rep simReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out.String())
	}
	want := "safe release-on-abort ack-after-failed-send ignore-generations unbounded-timeout single-ack-target release-on-remote-failure no-coverage-check self-renewed-lease no-tombstones restart-reuse own-tail-only release-on-drain-ack release-before-reap rank-lease-forgotten"
	var names []string
	for _, v := range rep.Variants {
		names = append(names, v.Name)
		if v.Seeds != 40 {
			t.Errorf("%s ran %d seeds, want 40", v.Name, v.Seeds)
		}
		switch v.Name {
		case "safe":
			if v.Violations != 0 {
				t.Errorf("safe: %d violations, first %s", v.Violations, v.FirstViolation)
			}
		case "release-on-abort":
			if v.Violations == 0 {
				t.Errorf("release-on-abort not caught in 40 seeds")
			}
		}
	}
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("variants %q, want %q", got, want)
	}
}

func TestSimRejectsBadInput(t *testing.T) {
	for _, args := range [][]string{{"--variant", "nope"}, {"--seeds", "0"}, {"--replay", "3"}} {
		cmd := newSimCommand()
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(args)
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), "invalid argument") {
			t.Errorf("%v: got %v, want an invalid-argument error", args, err)
		}
	}
}
