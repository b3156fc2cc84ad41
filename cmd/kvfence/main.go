package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:          "kvfence",
		Short:        "kvfence: the KV-cache transfer layer that never lets one request's bytes land in another's memory",
		SilenceUsage: true,
	}
	root.AddCommand(newSimCommand())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
