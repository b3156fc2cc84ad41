// Package dl (part of the public vendor kit, see plugins/kit) loads a
// vendor's C library at run time (dlopen/dlsym), the way
// go-nvml loads NVML: the plugin builds, links and starts without the
// library, and says in one classified line what is missing when it is not
// there.
//
// It owns finding the library (an environment variable naming its path,
// else the dynamic linker's search path), resolving required and optional
// symbols, and turning every failure into an *errdefs.Error of class
// FailedPrecondition whose message is a single line naming the variable;
// and keeping the library's writes to stdout off the plugin protocol
// (ProtectStdout).
//
// It must never call into the library (callers hold the symbols and the
// trampolines that match their signatures), never unload a library whose
// threads may still run (Close is for tests and for a library that never
// started anything), and never guess a path other than the ones it is given.
package dl
