package catalog

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvfence/kvfence/errdefs"
)

func TestResolve(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "kvfence-plugin-nixl")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := Resolve("nixl", "/nonexistent", dir); err != nil || got != bin {
		t.Errorf("Resolve(nixl) = %q, %v", got, err)
	}
	if got, err := Resolve(bin); err != nil || got != bin {
		t.Errorf("Resolve(path) = %q, %v", got, err)
	}
	for _, c := range []struct {
		value string
		class errdefs.Class
	}{{"", errdefs.InvalidArgument}, {"nosuch", errdefs.InvalidArgument}, {"mooncake", errdefs.NotFound}, {"./nope", errdefs.NotFound}, {dir + "/", errdefs.InvalidArgument}} {
		if _, err := Resolve(c.value, dir); !errdefs.Is(err, c.class) {
			t.Errorf("Resolve(%q): %v, want %v", c.value, err, c.class)
		}
	}
	if p, ok := Lookup("mori"); !ok || p.LibraryEnv != "KVFENCE_MORI_SHIM" {
		t.Errorf("Lookup(mori) = %+v", p)
	}
}
