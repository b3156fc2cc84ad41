// Package topo discovers the GPU/NIC topology of a host for `kvfence topo`:
// RDMA devices from sysfs (PCI path, NUMA node, netdevs, GIDs), GPUs from
// NVML (github.com/NVIDIA/go-nvml: PCI bus id, NUMA node), and a pairing of
// each GPU with its nearest RDMA NIC — same NUMA node first, then the
// shortest PCI path (hops to the closest common bridge).
//
// It owns reading (never writing) sysfs under a root it is given (so tests
// run on a fake tree under testdata) and querying an nvml.Interface it is
// given (so tests run on go-nvml's DGX H100 mock). Without a GPU or driver it
// says so and still lists NICs.
//
// It must never change device state (no NVML setters, no sysfs writes),
// never require a GPU or an RDMA device to succeed, and never import the
// core or a plugin.
package topo
