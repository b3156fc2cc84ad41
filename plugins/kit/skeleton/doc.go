// Package skeleton is the main of a vendor plugin binary built on the kit:
// read the settings from the environment (a bad one exits 2), point the
// process's stdout at stderr before the library loads (vendor libraries
// print there, and stdout is the plugin handshake's channel), load the
// library (a missing or unsupported one exits 1 with its one classified
// line), build the transport and serve it.
//
// It owns only that wiring and its exit codes. It must never interpret a
// vendor's settings or library: those are the plugin package's.
package skeleton
