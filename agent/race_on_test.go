//go:build race

package agent

// raceEnabled: this test binary runs under the race detector, where CPU-bound
// floods must be smaller to leave the honest peers any CPU at all.
const raceEnabled = true
