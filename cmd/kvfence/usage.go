package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// commandStarted is set when a command's own RunE begins: an error before
// that is cobra refusing the command line (exit 2), one after it is the
// command's (exit 1 unless it is a usageError).
var commandStarted bool

// refuseBeforeRun walks the command tree so that every refusal of the
// command line is a usage error: each runnable command marks when it
// starts, and a command that only groups subcommands refuses positionals
// (an unknown subcommand, with cobra's suggestion) and being run bare.
func refuseBeforeRun(c *cobra.Command) {
	for _, sub := range c.Commands() {
		refuseBeforeRun(sub)
	}
	switch {
	case c.RunE != nil:
		run := c.RunE
		c.RunE = func(cmd *cobra.Command, args []string) error {
			commandStarted = true
			return run(cmd, args)
		}
	case c.Run != nil:
		run := c.Run
		c.Run = func(cmd *cobra.Command, args []string) {
			commandStarted = true
			run(cmd, args)
		}
	case c.HasSubCommands() && c.HasParent():
		c.Args = unknownSubcommand
		c.RunE = func(cmd *cobra.Command, _ []string) error {
			return usagef("%s needs a subcommand: %s", cmd.CommandPath(), strings.Join(subcommandNames(cmd), ", "))
		}
	case c.HasSubCommands(): // the root: bare, it prints its help
		c.Args = unknownSubcommand
		c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
}

// unknownSubcommand refuses any positional of a command that only groups
// subcommands (cobra resolves the known ones before it gets here).
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %q?)", s[0])
	}
	return usagef("%s; known: %s", msg, strings.Join(subcommandNames(cmd), ", "))
}

func subcommandNames(cmd *cobra.Command) []string {
	var names []string
	for _, s := range cmd.Commands() {
		if s.IsAvailableCommand() {
			names = append(names, s.Name())
		}
	}
	return names
}

// oneLine folds a multi-line message (cobra's suggestions) into one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
