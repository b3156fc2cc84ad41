package skeleton

import (
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/plugins/kit/dl"
	"github.com/kvfence/kvfence/plugins/kit/nocancel"
	"github.com/kvfence/kvfence/sdk"
)

// Plugin is what a vendor plugin package provides, C being its settings.
type Plugin[C any] struct {
	// Name is the binary's name (its log name), e.g. kvfence-plugin-mooncake.
	Name string
	// Config reads the settings; an error is a usage error (exit 2).
	Config func(getenv func(string) string) (C, error)
	// Load loads the library and starts the backend; an error is one
	// classified line (exit 1).
	Load func(cfg C, getenv func(string) string, log hclog.Logger) (nocancel.Backend, error)
	// New builds the transport over the backend.
	New func(cfg C, be nocancel.Backend, log hclog.Logger) (*nocancel.Transport, error)
}

// Main runs the plugin binary and does not return.
func Main[C any](p Plugin[C]) {
	log := sdk.NewPluginLogger(p.Name)
	cfg, err := p.Config(os.Getenv)
	if err != nil {
		exit(2, err)
	}
	if err := dl.ProtectStdout(); err != nil {
		exit(1, err)
	}
	be, err := p.Load(cfg, os.Getenv, log)
	if err != nil {
		exit(1, err)
	}
	t, err := p.New(cfg, be, log)
	if err != nil {
		exit(1, err)
	}
	sdk.Serve(t, sdk.ServeOptions{Logger: log})
}

func exit(code int, err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(code)
}
