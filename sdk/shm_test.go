package sdk

import (
	"testing"

	"github.com/kvfence/kvfence/errdefs"
)

// Bytes written through a plugin's mapping are in the host's buffer: no copy.
func TestSharedMemoryIsShared(t *testing.T) {
	host, err := NewSharedMemory("t", 3*4096)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	d := host.Desc()
	d.Offset, d.Size = 4096+100, 200 // an unaligned window inside it
	m, err := MapMemory(d)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	copy(m.Bytes(), "hello")
	if string(host.Bytes()[4196:4201]) != "hello" {
		t.Fatalf("host sees %q", host.Bytes()[4196:4201])
	}
	host.Bytes()[4196+199] = 9
	if m.Bytes()[199] != 9 {
		t.Fatal("plugin does not see the host's write")
	}
}

func TestMapMemoryRejectsBadDescriptions(t *testing.T) {
	host, err := NewSharedMemory("t", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	big := host.Desc()
	big.Size = 8192
	cases := []struct {
		d    MemoryDesc
		want errdefs.Class
	}{
		{big, errdefs.InvalidArgument},
		{MemoryDesc{Kind: MemoryHostShared, Path: "/nonexistent", Size: 1}, errdefs.NotFound},
		{MemoryDesc{Kind: MemoryHostShared, Size: 1}, errdefs.InvalidArgument},
		{MemoryDesc{Kind: MemoryHostShared, Path: host.Desc().Path}, errdefs.InvalidArgument},
		{DescribeDMABuf(3, 0, 4096, "0000:01:00.0"), errdefs.Unimplemented},
	}
	for _, c := range cases {
		if _, err := MapMemory(c.d); errdefs.ClassOf(err) != c.want {
			t.Errorf("MapMemory(%+v): %v, want %v", c.d, err, c.want)
		}
	}
	if _, err := NewSharedMemory("z", 0); errdefs.ClassOf(err) != errdefs.InvalidArgument {
		t.Errorf("zero-size shared memory: %v", err)
	}
}
