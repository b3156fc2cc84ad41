package main

import (
	"fmt"
	"os"

	"github.com/kvfence/kvfence/plugins/tcp"
	"github.com/kvfence/kvfence/sdk"
)

func main() {
	log := sdk.NewPluginLogger("kvfence-plugin-tcp")
	cfg, err := tcp.ConfigFromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	cfg = applyBuildVariant(cfg)
	t, err := tcp.New(cfg, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sdk.Serve(wrapVariant(t), sdk.ServeOptions{Logger: log})
}
