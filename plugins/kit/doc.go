// Package kit is the public kit for vendors who wrap a C transfer library
// as a kvfence plugin, as this project's Mooncake, NIXL and MORI plugins
// do. It holds no code; its packages are importable from any module:
//
//   - kit/dl: load the library at run time (dlopen/dlsym) with one
//     classified line for every failure, and keep the library's stdout off
//     the plugin protocol (ProtectStdout).
//   - kit/nocancel: the whole sdk.Transport over a backend that can
//     neither cancel nor revoke: the batch lifecycle, the honest verdict
//     (never FailedDefinite on the library's word), the unbounded tail
//     (UnboundedTail), grants and the key directory; a vendor writes only
//     a Backend (its binding) and a status table.
//   - kit/nocancel/nocanceltest: the fault scenarios and the fault judge
//     (two real plugin processes over a fake library, SIGSTOP/SIGCONT of
//     the target, target memory watched after each promise), and
//     CertifyOverFake; layer 2 of the three plugin suites (contract in
//     sdk/sdktest → fault judge → certification in conformance).
//   - kit/dl/dltest: build a fake C library with the system compiler for
//     tests.
//   - kit/skeleton: the main of a vendor plugin binary.
//
// It must never hold a vendor's code or headers, and never weaken what
// its packages promise for one vendor's convenience: they are shared.
package kit
