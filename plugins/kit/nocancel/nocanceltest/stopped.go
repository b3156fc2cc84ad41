package nocanceltest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// allThreadsStopped reports whether every thread of pid is in the stopped
// state (T) in /proc; false when that cannot be read.
func allThreadsStopped(pid int) bool {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return false
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses and
		// may itself contain spaces or parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}
