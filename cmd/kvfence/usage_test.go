package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// usageTimeout bounds one refusal: it must come at once, before anything
// starts, so a command still running after this has started work.
func usageTimeout() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("KVFENCE_USAGE_TEST_TIMEOUT")); err == nil {
		return d
	}
	return 30 * time.Second
}

// Issue 19, item 4: every usage error exits 2 with one line, in every
// subcommand; cobra's own refusals (unknown command, positionals, required
// flags) included, and __agent checks every flag before its log or plugin.
func TestEveryUsageErrorExits2WithOneLine(t *testing.T) {
	out := t.TempDir()
	conf := []string{"conformance", "--out", out, "--plugin", agentExe}
	pre := []string{"__agent", "--role", "prefill", "--decode", "127.0.0.1:1"}
	cases := [][]string{
		{"nosuch"}, {"demoo"}, {"--nosuch-flag"}, {"cert", "nosuch"}, {"cert"}, {"completion", "nosuch"},
		{"demo", "extra"}, {"demo", "--concurrency", "0"},
		{"bench", "extra"}, {"bench", "--reps", "0"}, {"bench", "boundary", "extra"}, {"bench", "boundary", "--reps", "0"}, {"bench", "boundary", "--load", "-1"}, {"bench", "boundary", "--report", "/nonexistent/b.html"},
		{"sim", "--seeds", "0"}, {"sim", "--seeds", "-1"}, {"sim", "--variant", "nosuch"}, {"sim", "--replay", "5"},
		{"sim", "extra"}, {"sim", "--seeds", "x"},
		{"conformance"}, {"conformance", "extra"}, {"conformance", "--out", out, "--plugin", "/nonexistent"},
		append(conf, "--group", "nosuch"), append(conf, "--proxy", "maybe"), append(conf, "--repeat", "0"),
		append(conf, "--guard", "-1s"), append(conf, "--soak-batches", "0"), append(conf, "--soak-for", "-1s"), append(conf, "--env", "NOEQUALS"), append(conf, "--sign-key", "/nonexistent"),
		{"cert", "keygen"}, {"cert", "keygen", "--private", filepath.Join(out, "k")}, {"cert", "keygen", "extra"},
		{"cert", "verify"}, {"cert", "verify", "a", "b"}, {"cert", "verify", "c.json"},
		{"topo", "extra"}, {"topo", "--json=maybe"},
		{"__agent", "extra"}, {"__agent", "--role", "router"}, {"__agent", "--role", "prefill"},
		{"__agent", "--role", "prefill", "--decode", "nonsense"}, {"__agent", "--decode", "127.0.0.1:1"},
		{"__agent", "--slots", "0"}, {"__agent", "--shards", "0"}, {"__agent", "--shard-bytes", "0"},
		append(pre, "--lanes", "0"), append(pre, "--source-pages", "0"), append(pre, "--data-delay", "1ms"),
		{"__agent", "--max-inflight", "0"}, {"__agent", "--lease", "0s"}, {"__agent", "--max-hold", "1ms"},
		{"__agent", "--control", "nonsense"}, {"__agent", "--metrics", "nonsense"}, {"__agent", "--rank", "-1"},
		{"__agent", "--log", "/nonexistent/x.log"}, {"__agent", "--pki", "/nonexistent"},
		{"__agent", "--plugin-sha256", "xyz"}, {"__agent", "--require-certificate"}, {"__agent", "--plugin-env", "FOO"},
		{"__agent", "--plugin", "nosuch-plugin"}, {"__agent", "--quiesce-grace", "-1s"},
		{"__plugin-tcp", "extra"}, {"__holds-check"},
	}
	for _, args := range cases {
		code, stderr := runBounded(t, args...)
		line := strings.TrimRight(stderr, "\n")
		if code != 2 || strings.Contains(line, "\n") || !strings.HasPrefix(line, "kvfence: ") || strings.Contains(line, "goroutine") {
			t.Errorf("kvfence %s: exit %d, stderr %q; want exit 2 and one line", strings.Join(args, " "), code, stderr)
		}
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("refused commands left files behind in %s: %v", out, entries)
	}
	// Not usage errors: bare root prints its help, --version its version.
	for _, args := range [][]string{{}, {"--version"}, {"cert", "--help"}} {
		if code, stderr := runBounded(t, args...); code != 0 {
			t.Errorf("kvfence %s: exit %d (%s), want 0", strings.Join(args, " "), code, stderr)
		}
	}
}

// runBounded runs the test binary with args, killed after usageTimeout.
func runBounded(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), usageTimeout())
	defer cancel()
	cmd := exec.CommandContext(ctx, agentExe, args...)
	cmd.Dir = t.TempDir()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return -1, "still running after " + usageTimeout().String() + ": " + stderr.String()
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stderr.String()
	}
	t.Fatalf("kvfence %v: %v", args, err)
	return -1, ""
}
