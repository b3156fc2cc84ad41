package main

import (
	"fmt"
	"os"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/verbs"
	"github.com/kvfence/kvfence/sdk"
)

func main() {
	log := sdk.NewPluginLogger("kvfence-plugin-verbs")
	cfg, err := verbs.ConfigFromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	t, err := verbs.New(cfg, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if errdefs.IsInvalidArgument(err) {
			os.Exit(2) // the settings are wrong: a usage error
		}
		os.Exit(1)
	}
	sdk.Serve(t, sdk.ServeOptions{Logger: log})
}
