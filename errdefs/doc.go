// Package errdefs is kvfence's one error vocabulary: a small, closed set of
// classes (in the style of containerd's errdefs) that core, the transport
// SDK, the runtime an engine embeds and the control plane all use, each
// mapped to a gRPC code and back.
//
// A Class is itself an error, so errors.Is(err, errdefs.NotFound) works on
// anything that wraps a class with %w or carries it in an *Error; the Is...
// helpers also read the class of a gRPC status error. Callers branch on
// classes, never on error text.
//
// It owns the classes, their names and the gRPC mapping. It must never grow a
// class that callers cannot act on differently, and never map a timeout or a
// cancellation to a class that says nothing happened.
package errdefs
