// Command kvfence-certify runs the conformance suite (package conformance)
// on an RDMA plugin inside the Soft-RoCE VM: the initiator process on one
// device, the target process on another (rxe0 -> rxe1 over the veth wire),
// and writes the report and certificate into a directory that the VM hands
// back to the host.
//
// It owns only flag parsing and wiring; it must never weaken or skip a
// check of the suite, and never touch a network outside the VM.
package main
