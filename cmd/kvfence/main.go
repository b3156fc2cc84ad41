package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// commands holds the constructors of every subcommand; each command's file
// registers itself in an init function, so adding one touches no other file.
var commands []func() *cobra.Command

func register(newCommand func() *cobra.Command) { commands = append(commands, newCommand) }

func main() {
	root := &cobra.Command{
		Use:          "kvfence",
		Short:        "kvfence: the KV-cache transfer layer that never lets one request's bytes land in another's memory",
		SilenceUsage: true,
	}
	for _, c := range commands {
		root.AddCommand(c())
	}
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
