// Package unsafecore holds the policies of the known-unsafe core variants
// (core/knownunsafe names them): each breaks exactly one of the rules that
// knownunsafe.Policy lists, so that the simulation, the tests and the demo
// can show that the checker catches it.
//
// Importing the package registers every policy (init). Only core/sim,
// core's tests and agents built with -tags kvfenceunsafe import it; a
// default build of the runtime (libkvfence, agent, core, the plugins) links
// none of it, and TestDefaultBuildHoldsNoUnsafePolicy proves so. It must
// never be imported by a file that a default build of the runtime
// compiles, and it imports nothing of kvfence but core/knownunsafe.
package unsafecore
