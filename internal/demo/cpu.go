package demo

import (
	"os"
	"strconv"
	"time"
)

// clockTick is the unit of /proc's CPU times (USER_HZ: 100 on every Linux
// a Go binary runs on).
const clockTick = 10 * time.Millisecond

// cpuSample is the CPU time (user and system, every thread) each part of a
// run has used so far: the router (this process), decode's rank process and
// what it started (its plugin process), and both prefill ranks with theirs.
type cpuSample map[string]time.Duration

// cpuProbe samples a run's processes: the router is this process, decode
// and prefills are the given rank processes with their descendants.
func cpuProbe(decode int, prefills []int) func() cpuSample {
	return func() cpuSample {
		s := cpuSample{"router": treeCPU(os.Getpid(), false), "decode": treeCPU(decode, true)}
		for _, p := range prefills {
			s["prefill"] += treeCPU(p, true)
		}
		return s
	}
}

// since is the CPU each part used between earlier and s, in seconds. A
// part whose process exited meanwhile (a killed prefill rank) reads less
// than before: it counts 0, never a negative time.
func (s cpuSample) since(earlier cpuSample) map[string]float64 {
	out := map[string]float64{}
	for k, v := range s {
		out[k] = max(0, v-earlier[k]).Seconds()
	}
	return out
}

// treeCPU is pid's CPU time so far, and with descendants that of every
// live process below it too (a process that already exited counts
// nothing: a run's processes live until its summary is taken).
func treeCPU(pid int, descendants bool) time.Duration {
	t := procCPU(pid)
	if descendants {
		for _, c := range childrenOf(pid) {
			t += treeCPU(c, true)
		}
	}
	return t
}

// procCPU is one process's user and system time from /proc (0 if gone).
func procCPU(pid int) time.Duration {
	// After the command: utime is the 12th field, stime the 13th
	// (proc(5) fields 14 and 15).
	f := procStatFields(pid)
	if len(f) < 13 {
		return 0
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(u+s) * clockTick
}
