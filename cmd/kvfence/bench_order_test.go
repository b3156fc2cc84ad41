package main

import (
	"slices"
	"testing"
)

// TestArmOrderIsBalanced: over a full cycle of repetitions every order is
// a permutation, every arm runs in every position equally often, and
// directly after every other arm equally often (a cyclic rotation, the
// order before, fails the last: arm k always follows arm k-1).
func TestArmOrderIsBalanced(t *testing.T) {
	for n := 1; n <= 9; n++ {
		cycle := n
		if n%2 == 1 {
			cycle = 2 * n
		}
		pos := make([][]int, n)
		after := make([][]int, n)
		for a := range n {
			pos[a], after[a] = make([]int, n), make([]int, n)
		}
		for rep := range cycle {
			o := armOrder(n, rep)
			if s := slices.Sorted(slices.Values(o)); !slices.Equal(s, seq(n)) {
				t.Fatalf("n=%d rep %d: %v is not a permutation", n, rep, o)
			}
			for k, a := range o {
				pos[a][k]++
				if k > 0 {
					after[a][o[k-1]]++
				}
			}
		}
		for a := range n {
			for b := range n {
				if pos[a][b] != cycle/n {
					t.Errorf("n=%d: arm %d in position %d %d times, want %d", n, a, b, pos[a][b], cycle/n)
				}
				if want := (cycle / n) * btoi(a != b); n > 1 && after[a][b] != want {
					t.Errorf("n=%d: arm %d right after arm %d %d times, want %d", n, a, b, after[a][b], want)
				}
			}
		}
	}
}

// TestArmOrderRepeats: repetitions past one cycle start it again.
func TestArmOrderRepeats(t *testing.T) {
	for _, n := range []int{4, 5} {
		cycle := map[int]int{4: 4, 5: 10}[n]
		for rep := range cycle {
			if a, b := armOrder(n, rep), armOrder(n, rep+cycle); !slices.Equal(a, b) {
				t.Errorf("n=%d rep %d: %v, a cycle later %v", n, rep, a, b)
			}
		}
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
