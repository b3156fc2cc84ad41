// Package conformance is the certification suite for kvfence transport
// plugins: it checks that a plugin tells the truth about its writes — that
// Succeeded means the bytes are there and nothing more moves, that
// FailedDefinite and a Quiesce return mean nothing more moves, that Revoke
// revokes, that every batch gets exactly one completion, and that errors
// carry their exact class.
//
// It drives two real plugin processes (an initiator and a target, loaded with
// sdk.Open) over a real link — loopback, optionally through an in-path TCP
// fault proxy, or a veth pair between two network namespaces (--netns) —
// and injects real faults (proxy stall/delay/drop/reset on loopback; on a
// veth, kernel faults that reach every connection the plugin opens: tbf,
// TCP blackhole, nftables reject, socket abort, and netem delay and loss
// where the kernel has sch_netem; SIGSTOP/SIGCONT/SIGKILL). Each check's
// result names the fault mechanism that ran it (Result.Fault). A plugin is certified without any test hook
// of its own. Run(t, cfg) runs it as named Go subtests; Certify(ctx, cfg)
// runs it without a testing.T (the CLI) and returns a Report, which Write
// turns into JUnit XML, JSON, Markdown and — only for a complete, passing
// run of every check the plugin's profile requires — a certificate
// (signed with WriteSigned). Every Succeeded completion the suite sees, in
// every group, is compared with target memory the moment it arrives
// (verify.go), and the soak group keeps one plugin pair busy for thousands
// of batches of mixed sizes and depths, so that a plugin that lies only
// late in a process's life is caught. Tails are measured (the tail group), guard
// windows have a floor independent of the plugin's claim, and every fault
// is confirmed before a check counts it: a proxy fault that touched none of
// the plugin's data (its data does not take its endpoint address) leaves
// its check NOT RUN, so the run is partial, neither passed nor failed; and
// a proxy that carried none of the plugin's data does not stand in for the
// netem checks, which then stay required (profile.go).
//
// Two hosts (Config.TwoHost, `kvfence conformance --two-host`, the whole
// suite; CertifyTwoHost, `kvfence conformance two-host`, the link-fault
// checks alone; the target side is ServeTarget, `kvfence conformance
// target`): the target plugin processes run on a second host (here a
// second network namespace) that owns the destination memory and reports
// what it observes there over an HMAC-authenticated control channel on a
// management link; checks see target memory only through targetMem, which
// is local memory on one host and that channel on two. The certifying side
// drives kernel faults on the data link (TCP blackhole, tbf, socket abort,
// nftables reject, netem where present), which reach every connection the
// plugin opens. See docs/conformance-two-host.md.
//
// Layer 3 of the three plugin suites (contract → fault judge →
// certification; docs/writing-a-plugin.md §6), and the only one that
// certifies: it runs layer 1's contract checks (sdk/sdktest) as its
// sdk-contract group on a fresh pair, and adds real faults on real links,
// the tails, the soak and the certificate. Layer 2, the vendor kit's fault
// judge (plugins/kit/nocancel/nocanceltest), calls it over fake libraries.
//
// It owns the checks, the fault injectors and the report formats. It must
// never import the core, never reach into a plugin's internals (only the sdk
// contract, signals and the link), never touch a network other than
// loopback, the namespaces it creates and the way to a target host the
// operator names (Config.RemoteTarget), never weaken a check to let a
// plugin pass, never assert on speed (the performance group is information
// only), and
// never write a certificate for a run that skipped a required check.
package conformance
