package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// commands holds the constructors of every subcommand; each command's file
// registers itself in an init function, so adding one touches no other file.
var commands []func() *cobra.Command

func register(newCommand func() *cobra.Command) { commands = append(commands, newCommand) }

// usageError is a refusal of the command line itself (a bad flag value, a
// variant this build leaves out): exit status 2, one line, before any work.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// usagef builds a usageError.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "kvfence",
		Short: "kvfence: the KV-cache transfer layer that never lets one request's bytes land in another's memory",
		// Errors are printed once, by main, not by cobra as well.
		SilenceUsage: true, SilenceErrors: true,
		Version: versionString(),
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	for _, c := range commands {
		root.AddCommand(c())
	}
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	refuseBeforeRun(root)
	return root
}

func main() {
	err := newRoot().Execute()
	if err == nil {
		return
	}
	var ue usageError
	if errors.As(err, &ue) || !commandStarted {
		// Cobra's own refusals (unknown command, positionals, required
		// flags) come before any command runs: usage errors too.
		fmt.Fprintln(os.Stderr, "kvfence:", oneLine(err.Error()))
		os.Exit(2)
	}
	fmt.Fprintln(os.Stderr, "kvfence:", err)
	os.Exit(1)
}
