//go:build !rdma

package verbs

import "github.com/kvfence/kvfence/errdefs"

// Built without the "rdma" tag: there is no libibverbs binding. Every
// device operation reports Unavailable with the reason, so the plugin still
// builds (and its pure-Go logic is tested) on machines without RDMA headers.

const haveVerbs = false

var errNoVerbs = errdefs.Errorf(errdefs.Unavailable, "verbs: built without -tags rdma (needs libibverbs-dev); no RDMA support compiled in")

type dev struct{}
type mr struct{}
type qp struct{}
type mw struct{}

func openDevice(name string, gid *[16]byte) (*dev, error) { return nil, errNoVerbs }

func (d *dev) info() devInfo                                               { return devInfo{} }
func (d *dev) regMR(addr uintptr, n, iova uint64, access int) (*mr, error) { return nil, errNoVerbs }
func (d *dev) regDMABuf(fd int, off, n, iova uint64, access int) (*mr, error) {
	return nil, errNoVerbs
}
func (d *dev) newQP(depth int) (*qp, error) { return nil, errNoVerbs }
func (d *dev) poll(buf []wc) (int, error)   { return 0, errNoVerbs }
func (d *dev) allocMW1() (*mw, error)       { return nil, errNoVerbs }
func (d *dev) arm() error                   { return errNoVerbs }
func (d *dev) wait(ms int) (bool, error)    { return false, errNoVerbs }
func (d *dev) bindMW1(m *mw, on *mr, addr, n uint64, access int) (uint32, error) {
	return 0, errNoVerbs
}
func (d *dev) newResponderQP(depth int) (*qp, error) { return nil, errNoVerbs }
func (d *dev) allocMW2() (*mw, error)                { return nil, errNoVerbs }
func (d *dev) bindMW2(on *qp, m *mw, r *mr, addr, n uint64, access int) (uint32, error) {
	return 0, errNoVerbs
}
func (d *dev) invalidateMW2(rkey uint32) error                          { return errNoVerbs }
func (d *dev) close()                                                   {}
func (m *mr) lkey() uint32                                              { return 0 }
func (m *mr) rkey() uint32                                              { return 0 }
func (m *mr) dereg() error                                              { return errNoVerbs }
func (q *qp) num() uint32                                               { return 0 }
func (q *qp) connect(r qpAttrs, psn uint32, timeout, retry uint8) error { return errNoVerbs }
func (q *qp) post(wrs []wr, closeID uint64) (int, bool, error)          { return 0, false, errNoVerbs }
func (q *qp) broken() bool                                              { return true }
func (q *qp) toError() error                                            { return errNoVerbs }
func (q *qp) destroy() error                                            { return errNoVerbs }
func (m *mw) dealloc() error                                            { return errNoVerbs }
