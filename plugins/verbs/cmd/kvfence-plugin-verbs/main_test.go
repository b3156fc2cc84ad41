package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/sdk/sdktest"
)

// The command, out of process: a bad setting is a usage error (exit 2,
// its class and reason on stderr); a transport that cannot start (here:
// built without -tags rdma, so no device) exits 1 and says why. Either
// way the process ends with one classified line instead of a go-plugin
// handshake.
func TestCommandExitsByClass(t *testing.T) {
	bin, err := sdktest.BuildPlugin(t.TempDir(), "github.com/kvfence/kvfence/plugins/verbs/cmd/kvfence-plugin-verbs")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		env  string
		code int
		text string
	}{
		{"KVFENCE_VERBS_TIMEOUT=x", 2, "invalid-argument: verbs: KVFENCE_VERBS_TIMEOUT"},
		{"KVFENCE_VERBS_TIMEOUT=99", 2, "invalid-argument: verbs: QP timeout exponent 99"},
		{"KVFENCE_VERBS_RETRY_CNT=7", 2, "invalid-argument: verbs: retry_cnt 7 refused"},
		{"KVFENCE_VERBS_LISTEN=nowhere", 2, "invalid-argument: verbs: listen address"},
		{"KVFENCE_VERBS_POLL=event", 1, "unavailable: verbs: built without -tags rdma"},
	}
	for _, tc := range cases {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), tc.env)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != tc.code || !strings.Contains(stderr.String(), tc.text) {
			t.Errorf("%s: %v, stderr %q; want exit %d and %q", tc.env, err, stderr.String(), tc.code, tc.text)
		}
	}
}
