package sdk

import "github.com/kvfence/kvfence/errdefs"

// Errors crossing the contract are classified in the project's one
// vocabulary, package errdefs (errdefs.Errorf, errdefs.Is, errdefs.ClassOf):
// callers branch on classes, never on strings. The SDK adds no second name
// for a class; it only carries classes over the wire.

// toStatusError turns any error into a gRPC status error for the wire: a
// classified error keeps its class; an unclassified one becomes Internal
// (a plugin bug: the contract demands classified errors).
func toStatusError(err error) error { return errdefs.ToGRPC(err) }

// fromStatusError turns a gRPC error from the plugin into a classified error.
func fromStatusError(err error) error { return errdefs.FromGRPC(err) }
