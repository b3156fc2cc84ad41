package main

// armOrder is the order in which repetition rep runs n arms: the rows of
// a Williams design (a Latin square balanced for first-order carryover),
// one per repetition. Over a full cycle (n repetitions for an even n, 2n
// for an odd one: the rows and their mirror images, alternating) every
// arm runs in every position equally often, and directly after every
// other arm equally often. Rotating one order, as before, ran each arm
// always right after the same other arm, so whatever one run leaves behind
// for the next was counted against the same arm every time; now it is
// spread over all of them.
func armOrder(n, rep int) []int {
	row, mirror := rep%n, false
	if n%2 == 1 {
		row, mirror = (rep/2)%n, rep%2 == 1
	}
	out := make([]int, n)
	for k := range out {
		// The generator 0, 1, n-1, 2, n-2, ... shifted by the row.
		g := (k + 1) / 2
		if k > 0 && k%2 == 0 {
			g = n - k/2
		}
		out[k] = (g + row) % n
	}
	if mirror {
		for i, j := 0, n-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	}
	return out
}
