//go:build rdma

package verbs

/*
#cgo LDFLAGS: -libverbs
#include <infiniband/verbs.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Static_assert(IBV_WC_SUCCESS == 0 && IBV_WC_WR_FLUSH_ERR == 5 && IBV_WC_REM_ACCESS_ERR == 10 &&
	IBV_WC_RETRY_EXC_ERR == 12 && IBV_WC_GENERAL_ERR == 21, "ibv_wc_status values moved");
_Static_assert(IBV_ACCESS_LOCAL_WRITE == 1 && IBV_ACCESS_REMOTE_WRITE == 2 &&
	IBV_ACCESS_REMOTE_READ == 4 && IBV_ACCESS_MW_BIND == 16, "ibv_access_flags values moved");

struct kvf_dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch; // completion events of cq
	struct ibv_cq *cq;       // every data QP
	struct ibv_cq *bcq;      // the memory-window bind QP pair
	struct ibv_qp *bqp[2];
	int gidx, mtu, max_rd_atom, mw1, mw2a, mw2b;
	uint8_t gid[16];
	char name[64];
};

static const uint8_t v4pfx[12] = {0,0,0,0,0,0,0,0,0,0,0xff,0xff};

// kvf_open opens the device called name (any if empty) holding gid (the
// first IPv4-mapped GID of port 1 if use_gid is 0). Returns 0 or -errno.
static int kvf_open(struct kvf_dev *d, const char *name, const uint8_t *want, int use_gid) {
	int n = 0, rc = -ENODEV;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l) return -(errno ? errno : ENODEV);
	for (int i = 0; i < n && rc; i++) {
		const char *dn = ibv_get_device_name(l[i]);
		if (name[0] && strcmp(dn, name)) continue;
		struct ibv_context *ctx = ibv_open_device(l[i]);
		if (!ctx) continue;
		struct ibv_port_attr pa;
		struct ibv_device_attr da;
		if (ibv_query_port(ctx, 1, &pa) || ibv_query_device(ctx, &da)) { ibv_close_device(ctx); continue; }
		for (int j = 0; j < pa.gid_tbl_len && j < 1024; j++) {
			union ibv_gid g;
			if (ibv_query_gid(ctx, 1, j, &g)) continue;
			if (use_gid ? memcmp(g.raw, want, 16) : memcmp(g.raw, v4pfx, 12)) continue;
			d->ctx = ctx; d->gidx = j; memcpy(d->gid, g.raw, 16);
			strncpy(d->name, dn, sizeof d->name - 1);
			d->mtu = pa.active_mtu; d->max_rd_atom = da.max_qp_rd_atom;
			d->mw1 = !!(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
			d->mw2a = !!(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2A);
			d->mw2b = !!(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
			rc = 0;
			break;
		}
		if (rc) ibv_close_device(ctx);
	}
	ibv_free_device_list(l);
	if (rc) return rc;
	d->pd = ibv_alloc_pd(d->ctx);
	d->ch = ibv_create_comp_channel(d->ctx);
	if (!d->ch) return -(errno ? errno : ENOMEM);
	int fl = fcntl(d->ch->fd, F_GETFL);
	if (fl < 0 || fcntl(d->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) return -(errno ? errno : EIO);
	d->cq = ibv_create_cq(d->ctx, 16384, NULL, d->ch, 0);
	if (!d->cq) d->cq = ibv_create_cq(d->ctx, 4096, NULL, d->ch, 0);
	d->bcq = ibv_create_cq(d->ctx, 64, NULL, NULL, 0);
	if (!d->pd || !d->cq || !d->bcq) return -ENOMEM;
	return 0;
}

static void kvf_close(struct kvf_dev *d) {
	for (int i = 0; i < 2; i++) if (d->bqp[i]) ibv_destroy_qp(d->bqp[i]);
	if (d->bcq) ibv_destroy_cq(d->bcq);
	if (d->cq) ibv_destroy_cq(d->cq);   // every event was acknowledged (kvf_wait)
	if (d->ch) ibv_destroy_comp_channel(d->ch);
	if (d->pd) ibv_dealloc_pd(d->pd);
	if (d->ctx) ibv_close_device(d->ctx);
	memset(d, 0, sizeof *d);
}

static struct ibv_mr *kvf_reg(struct kvf_dev *d, uintptr_t addr, size_t n, uint64_t iova, int acc, int *err) {
	struct ibv_mr *m = ibv_reg_mr_iova(d->pd, (void *)addr, n, iova, acc);
	if (!m) *err = errno;
	return m;
}

static struct ibv_mr *kvf_reg_dmabuf(struct kvf_dev *d, int fd, uint64_t off, size_t n, uint64_t iova, int acc, int *err) {
	struct ibv_mr *m = ibv_reg_dmabuf_mr(d->pd, off, n, iova, fd, acc);
	if (!m) *err = errno;
	return m;
}

static struct ibv_qp *kvf_qp(struct kvf_dev *d, struct ibv_cq *cq, int depth, int *err) {
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.send_cq = cq; ia.recv_cq = cq; ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = depth; ia.cap.max_recv_wr = 1;
	ia.cap.max_send_sge = 1; ia.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(d->pd, &ia);
	if (!qp) { *err = errno; return NULL; }
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT; a.port_num = 1; a.pkey_index = 0;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	if ((*err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))) {
		ibv_destroy_qp(qp);
		return NULL;
	}
	return qp;
}

static int kvf_connect(struct kvf_dev *d, struct ibv_qp *qp, uint32_t dqpn, uint32_t rpsn, const uint8_t *dgid,
		uint32_t spsn, int timeout, int retry) {
	int rd = d->max_rd_atom < 1 ? 1 : (d->max_rd_atom > 16 ? 16 : d->max_rd_atom);
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR; a.path_mtu = d->mtu; a.dest_qp_num = dqpn; a.rq_psn = rpsn;
	a.max_dest_rd_atomic = rd; a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1; memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
	a.ah_attr.grh.sgid_index = d->gidx; a.ah_attr.grh.hop_limit = 64; a.ah_attr.port_num = 1;
	int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (rc) return rc;
	memset(&a, 0, sizeof a);
	// rnr_retry 0: RDMA WRITE/READ never meet RNR, and 7 would mean forever.
	a.qp_state = IBV_QPS_RTS; a.timeout = timeout; a.retry_cnt = retry; a.rnr_retry = 0;
	a.sq_psn = spsn; a.max_rd_atomic = rd;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

// kvf_qp_state returns the QP's current state (enum ibv_qp_state) or -errno.
static int kvf_qp_state(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	int rc = ibv_query_qp(qp, &a, IBV_QP_STATE, &ia);
	return rc ? -rc : (int)a.qp_state;
}

static int kvf_to_error(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

struct kvf_wr { uint64_t laddr, raddr, id; uint32_t len, lkey, rkey, read, sig; };

// kvf_post posts n work requests as one chain (only those with sig set are
// signalled); returns how many were posted (all of them, or those before the
// one ibv_post_send refused) and the error in *err. When the chain was cut
// after an unsignalled request, the last posted request is posted once more,
// signalled, with wr_id close_id (an idempotent copy: same bytes, same
// place), so the posted part still ends with a completion; *closed says
// whether that worked.
static int kvf_post(struct ibv_qp *qp, struct kvf_wr *w, int n, uint64_t close_id, int *err, int *closed) {
	struct ibv_send_wr stwr[32], *wrs = stwr;
	struct ibv_sge stsg[32], *sg = stsg;
	*closed = 0;
	if (n > 32) {
		wrs = calloc(n, sizeof *wrs);
		sg = calloc(n, sizeof *sg);
		if (!wrs || !sg) { free(wrs); free(sg); *err = ENOMEM; return 0; }
	}
	memset(wrs, 0, n * sizeof *wrs);
	for (int i = 0; i < n; i++) {
		sg[i].addr = w[i].laddr; sg[i].length = w[i].len; sg[i].lkey = w[i].lkey;
		wrs[i].wr_id = w[i].id; wrs[i].sg_list = &sg[i]; wrs[i].num_sge = 1;
		wrs[i].opcode = w[i].read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
		wrs[i].send_flags = w[i].sig ? IBV_SEND_SIGNALED : 0;
		wrs[i].wr.rdma.remote_addr = w[i].raddr; wrs[i].wr.rdma.rkey = w[i].rkey;
		wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
	}
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(qp, wrs, &bad), posted = n;
	if (rc) {
		*err = rc; posted = bad ? (int)(bad - wrs) : 0;
		if (posted > 0 && !w[posted - 1].sig) {
			struct ibv_send_wr c = wrs[posted - 1];
			c.wr_id = close_id; c.send_flags = IBV_SEND_SIGNALED; c.next = NULL;
			*closed = ibv_post_send(qp, &c, &bad) == 0;
		}
	}
	if (wrs != stwr) { free(wrs); free(sg); }
	return posted;
}

struct kvf_wc { uint64_t id; uint32_t status, qpn; };

static int kvf_poll(struct ibv_cq *cq, struct kvf_wc *out, int n) {
	struct ibv_wc wc[64];
	if (n > 64) n = 64;
	int k = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < k; i++) { out[i].id = wc[i].wr_id; out[i].status = wc[i].status; out[i].qpn = wc[i].qp_num; }
	return k;
}

// kvf_arm asks for an event at the next completion of the data CQ.
static int kvf_arm(struct kvf_dev *d) { return ibv_req_notify_cq(d->cq, 0); }

// kvf_wait waits up to ms milliseconds for a completion event of the data CQ
// (armed by kvf_arm) and acknowledges it. Returns 1 (event), 0 (timeout) or
// -errno.
static int kvf_wait(struct kvf_dev *d, int ms) {
	struct pollfd p = { .fd = d->ch->fd, .events = POLLIN };
	int r = poll(&p, 1, ms);
	if (r < 0) return errno == EINTR ? 0 : -errno;
	if (r == 0) return 0;
	struct ibv_cq *cq;
	void *cctx;
	if (ibv_get_cq_event(d->ch, &cq, &cctx)) return errno == EAGAIN ? 0 : -(errno ? errno : EIO);
	ibv_ack_cq_events(cq, 1);
	return 1;
}

// Type-1 memory windows are bound with ibv_bind_mw, a work request on some
// QP of the PD: a private pair of QPs connected to each other serves that.
static int kvf_bind_pair(struct kvf_dev *d, int timeout, int retry) {
	if (d->bqp[0]) return 0;
	int err = 0;
	for (int i = 0; i < 2; i++) if (!(d->bqp[i] = kvf_qp(d, d->bcq, 16, &err))) return err ? err : EIO;
	if ((err = kvf_connect(d, d->bqp[0], d->bqp[1]->qp_num, 0, d->gid, 0, timeout, retry))) return err;
	return kvf_connect(d, d->bqp[1], d->bqp[0]->qp_num, 0, d->gid, 0, timeout, retry);
}

// kvf_wait_bcq waits (20 s at most) for the completion of work request id on
// the bind CQ, dropping any other one (a late completion of an earlier call
// that timed out); returns its ibv_wc_status, or -errno.
static int kvf_wait_bcq(struct kvf_dev *d, uint64_t id) {
	struct ibv_wc wc;
	for (int i = 0; i < 200000; i++) {     // 20 s
		int k = ibv_poll_cq(d->bcq, 1, &wc);
		if (k < 0) return -EIO;
		if (k == 1 && wc.wr_id == id) return wc.status;
		if (k == 0) usleep(100);
	}
	return -ETIMEDOUT;
}

// kvf_reset_bind_pair drops the bind QP pair after an operation on it failed
// (the failure moved it to ERROR); the next bind creates a new pair.
static void kvf_reset_bind_pair(struct kvf_dev *d) {
	for (int i = 0; i < 2; i++) if (d->bqp[i]) { ibv_destroy_qp(d->bqp[i]); d->bqp[i] = NULL; }
}

// kvf_bind1 binds (n > 0) or unbinds (n == 0) a type-1 window and waits for
// the bind's completion; returns its ibv_wc_status, or -errno.
static int kvf_bind1(struct kvf_dev *d, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t addr, uint64_t n, int acc, uint64_t id) {
	struct ibv_mw_bind mb;
	memset(&mb, 0, sizeof mb);
	mb.wr_id = id; mb.send_flags = IBV_SEND_SIGNALED;
	mb.bind_info.mr = mr; mb.bind_info.addr = addr; mb.bind_info.length = n; mb.bind_info.mw_access_flags = acc;
	int rc = ibv_bind_mw(d->bqp[0], mw, &mb);
	if (rc) return -rc;
	int st = kvf_wait_bcq(d, id);
	if (st) kvf_reset_bind_pair(d);
	return st;
}

// kvf_bind2 binds a type-2 window with a BIND_MW work request on qp, the
// responder QP of the one writer allowed to use it: from then on the device
// accepts the new rkey on that QP only. Responder QPs complete on bcq.
// Returns the ibv_wc_status (the new rkey in *rkey), or -errno.
static int kvf_bind2(struct kvf_dev *d, struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mr *mr,
		uint64_t addr, uint64_t n, int acc, uint64_t id, uint32_t *rkey) {
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof wr);
	uint32_t nk = ibv_inc_rkey(mw->rkey);
	wr.wr_id = id; wr.opcode = IBV_WR_BIND_MW; wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = mw; wr.bind_mw.rkey = nk;
	wr.bind_mw.bind_info.mr = mr; wr.bind_mw.bind_info.addr = addr;
	wr.bind_mw.bind_info.length = n; wr.bind_mw.bind_info.mw_access_flags = acc;
	int rc = ibv_post_send(qp, &wr, &bad);
	if (rc) return -rc;
	int st = kvf_wait_bcq(d, id);
	if (st == 0) { mw->rkey = nk; *rkey = nk; }
	return st;
}

// kvf_local_inv invalidates the type-2 window holding rkey with a LOCAL_INV
// work request on the private bind QP (any QP of the PD may post it). On
// success the window is free again and its QP refuses the rkey. Invalidating
// a window that is not bound is an error (and on rxe 6.1 a NULL dereference
// in the kernel): the caller tracks which windows are bound.
static int kvf_local_inv(struct kvf_dev *d, uint32_t rkey, uint64_t id) {
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = id; wr.opcode = IBV_WR_LOCAL_INV; wr.send_flags = IBV_SEND_SIGNALED;
	wr.invalidate_rkey = rkey;
	int rc = ibv_post_send(d->bqp[0], &wr, &bad);
	if (rc) return -rc;
	int st = kvf_wait_bcq(d, id);
	if (st) kvf_reset_bind_pair(d);
	return st;
}
*/
import "C"

import (
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
)

const haveVerbs = true

type dev struct {
	c      *C.struct_kvf_dev
	bind   sync.Mutex // the bind QP pair and the bind CQ
	nextWR uint64     // work request ids on the bind CQ (under bind)
	inf    devInfo
}
type mr struct{ c *C.struct_ibv_mr }
type qp struct {
	c *C.struct_ibv_qp
	d *dev
}
type mw struct{ c *C.struct_ibv_mw }

func errnoErr(class errdefs.Class, what string, e C.int) error {
	if e < 0 {
		e = -e
	}
	return errdefs.Errorf(class, "verbs: %s: %v", what, syscall.Errno(e))
}

func openDevice(name string, gid *[16]byte) (*dev, error) {
	d := &dev{c: (*C.struct_kvf_dev)(C.calloc(1, C.sizeof_struct_kvf_dev))}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var want [16]C.uint8_t
	use := C.int(0)
	if gid != nil {
		use = 1
		for i, b := range gid {
			want[i] = C.uint8_t(b)
		}
	}
	if rc := C.kvf_open(d.c, cname, &want[0], use); rc != 0 {
		C.kvf_close(d.c)
		C.free(unsafe.Pointer(d.c))
		return nil, errnoErr(errdefs.Unavailable, fmt.Sprintf("open device %q", name), rc)
	}
	d.inf = devInfo{Name: C.GoString(&d.c.name[0]), GIDIndex: int(d.c.gidx), MW1: d.c.mw1 != 0,
		MW2A: d.c.mw2a != 0, MW2B: d.c.mw2b != 0, MaxRdAtom: int(d.c.max_rd_atom), MTU: int(d.c.mtu)}
	for i := range d.inf.GID {
		d.inf.GID[i] = byte(d.c.gid[i])
	}
	return d, nil
}

func (d *dev) info() devInfo { return d.inf }

func (d *dev) regMR(addr uintptr, n, iova uint64, access int) (*mr, error) {
	var e C.int
	m := C.kvf_reg(d.c, C.uintptr_t(addr), C.size_t(n), C.uint64_t(iova), C.int(access), &e)
	if m == nil {
		return nil, errnoErr(errdefs.ResourceExhausted, "ibv_reg_mr_iova", e)
	}
	return &mr{c: m}, nil
}

func (d *dev) regDMABuf(fd int, off, n, iova uint64, access int) (*mr, error) {
	var e C.int
	m := C.kvf_reg_dmabuf(d.c, C.int(fd), C.uint64_t(off), C.size_t(n), C.uint64_t(iova), C.int(access), &e)
	if m == nil {
		return nil, errnoErr(errdefs.Unavailable, "ibv_reg_dmabuf_mr", e)
	}
	return &mr{c: m}, nil
}

func (d *dev) newQP(depth int) (*qp, error) { return d.qpOn(d.c.cq, depth) }

// newResponderQP creates a QP that only answers a writer: its own work
// requests (type-2 binds) complete on the bind CQ, never on the data CQ.
func (d *dev) newResponderQP(depth int) (*qp, error) { return d.qpOn(d.c.bcq, depth) }

func (d *dev) qpOn(cq *C.struct_ibv_cq, depth int) (*qp, error) {
	var e C.int
	q := C.kvf_qp(d.c, cq, C.int(depth), &e)
	if q == nil {
		return nil, errnoErr(errdefs.ResourceExhausted, "ibv_create_qp", e)
	}
	return &qp{c: q, d: d}, nil
}

func (d *dev) poll(buf []wc) (int, error) {
	var out [64]C.struct_kvf_wc
	n := len(buf)
	if n > 64 {
		n = 64
	}
	k := int(C.kvf_poll(d.c.cq, &out[0], C.int(n)))
	if k < 0 {
		return 0, errdefs.Errorf(errdefs.Internal, "verbs: ibv_poll_cq failed")
	}
	for i := 0; i < k; i++ {
		buf[i] = wc{ID: uint64(out[i].id), Status: WCStatus(out[i].status), QPN: uint32(out[i].qpn)}
	}
	return k, nil
}

// arm requests a completion event for the next completion of the data CQ;
// wait blocks (in C, off the Go scheduler's P) until that event or ms
// milliseconds. Poll once more after arm: a completion may have come first.
func (d *dev) arm() error {
	if rc := C.kvf_arm(d.c); rc != 0 {
		return errnoErr(errdefs.Internal, "ibv_req_notify_cq", rc)
	}
	return nil
}

func (d *dev) wait(ms int) (bool, error) {
	r := C.kvf_wait(d.c, C.int(ms))
	if r < 0 {
		return false, errnoErr(errdefs.Internal, "completion channel", r)
	}
	return r == 1, nil
}

func (d *dev) allocMW1() (*mw, error) {
	m, err := C.ibv_alloc_mw(d.c.pd, C.IBV_MW_TYPE_1)
	if m == nil {
		return nil, errdefs.Errorf(errdefs.ResourceExhausted, "verbs: ibv_alloc_mw(type 1): %v", err)
	}
	return &mw{c: m}, nil
}

// bindMW1 binds m over [addr, addr+n) of on (n == 0 unbinds) and returns the
// window's rkey once the bind completed.
func (d *dev) bindMW1(m *mw, on *mr, addr, n uint64, access int) (uint32, error) {
	d.bind.Lock()
	defer d.bind.Unlock()
	if rc := C.kvf_bind_pair(d.c, defaultTimeout, defaultRetryCnt); rc != 0 {
		return 0, errnoErr(errdefs.Internal, "memory-window bind QP pair", rc)
	}
	d.nextWR++
	st := C.kvf_bind1(d.c, m.c, on.c, C.uint64_t(addr), C.uint64_t(n), C.int(access), C.uint64_t(d.nextWR))
	if st < 0 {
		return 0, errnoErr(errdefs.Internal, "ibv_bind_mw", st)
	}
	if st != 0 {
		return 0, errdefs.Errorf(errdefs.Internal, "verbs: ibv_bind_mw completed with %v", WCStatus(st))
	}
	return uint32(m.c.rkey), nil
}

func (d *dev) allocMW2() (*mw, error) {
	m, err := C.ibv_alloc_mw(d.c.pd, C.IBV_MW_TYPE_2)
	if m == nil {
		return nil, errdefs.Errorf(errdefs.ResourceExhausted, "verbs: ibv_alloc_mw(type 2): %v", err)
	}
	return &mw{c: m}, nil
}

// bindMW2 binds the type-2 window m over [addr, addr+n) of on through the
// responder QP on, and returns its new rkey once the bind completed. A bind
// that completes with an error leaves on in ERROR (the writer's connection
// ends).
func (d *dev) bindMW2(on *qp, m *mw, r *mr, addr, n uint64, access int) (uint32, error) {
	d.bind.Lock()
	defer d.bind.Unlock()
	d.nextWR++
	var rkey C.uint32_t
	st := C.kvf_bind2(d.c, on.c, m.c, r.c, C.uint64_t(addr), C.uint64_t(n), C.int(access), C.uint64_t(d.nextWR), &rkey)
	if st < 0 {
		return 0, errnoErr(errdefs.FailedPrecondition, "post BIND_MW on the writer's QP", st)
	}
	if st != 0 {
		return 0, errdefs.Errorf(errdefs.FailedPrecondition, "verbs: BIND_MW on the writer's QP completed with %v", WCStatus(st))
	}
	return uint32(rkey), nil
}

// invalidateMW2 posts LOCAL_INV for rkey (a bound type-2 window) and returns
// once it completed: the device refuses the rkey from then on.
func (d *dev) invalidateMW2(rkey uint32) error {
	d.bind.Lock()
	defer d.bind.Unlock()
	if rc := C.kvf_bind_pair(d.c, defaultTimeout, defaultRetryCnt); rc != 0 {
		return errnoErr(errdefs.Internal, "memory-window bind QP pair", rc)
	}
	d.nextWR++
	st := C.kvf_local_inv(d.c, C.uint32_t(rkey), C.uint64_t(d.nextWR))
	if st < 0 {
		return errnoErr(errdefs.Internal, "post LOCAL_INV", st)
	}
	if st != 0 {
		return errdefs.Errorf(errdefs.Internal, "verbs: LOCAL_INV completed with %v", WCStatus(st))
	}
	return nil
}

func (d *dev) close() {
	if d.c != nil {
		C.kvf_close(d.c)
		C.free(unsafe.Pointer(d.c))
		d.c = nil
	}
}

func (m *mr) lkey() uint32 { return uint32(m.c.lkey) }
func (m *mr) rkey() uint32 { return uint32(m.c.rkey) }
func (m *mr) dereg() error {
	if rc := C.ibv_dereg_mr(m.c); rc != 0 {
		return errnoErr(errdefs.Internal, "ibv_dereg_mr", rc)
	}
	return nil
}

func (q *qp) num() uint32 { return uint32(q.c.qp_num) }

func (q *qp) connect(r qpAttrs, psn uint32, timeout, retry uint8) error {
	var g [16]C.uint8_t
	for i, b := range r.GID {
		g[i] = C.uint8_t(b)
	}
	if rc := C.kvf_connect(q.d.c, q.c, C.uint32_t(r.QPN), C.uint32_t(r.PSN), &g[0], C.uint32_t(psn), C.int(timeout), C.int(retry)); rc != 0 {
		return errnoErr(errdefs.Unavailable, "connect QP (RTR/RTS)", rc)
	}
	return nil
}

func (q *qp) post(wrs []wr, closeID uint64) (int, bool, error) {
	if len(wrs) == 0 {
		return 0, false, nil
	}
	arr := make([]C.struct_kvf_wr, len(wrs)) // no Go pointers inside: may be passed to C
	for i, w := range wrs {
		arr[i] = C.struct_kvf_wr{laddr: C.uint64_t(w.LAddr), raddr: C.uint64_t(w.RAddr), id: C.uint64_t(w.ID),
			len: C.uint32_t(w.Len), lkey: C.uint32_t(w.LKey), rkey: C.uint32_t(w.RKey)}
		if w.Read {
			arr[i].read = 1
		}
		if w.Signal {
			arr[i].sig = 1
		}
	}
	var e, closed C.int
	n := int(C.kvf_post(q.c, &arr[0], C.int(len(wrs)), C.uint64_t(closeID), &e, &closed))
	if e != 0 {
		return n, closed != 0, errnoErr(errdefs.ResourceExhausted, "ibv_post_send", e)
	}
	return n, false, nil
}

// broken reports whether the QP is in ERROR (or cannot be queried): a
// responder QP goes there when it refuses a write (remote access error).
func (q *qp) broken() bool {
	st := C.kvf_qp_state(q.c)
	return st < 0 || st == C.IBV_QPS_ERR
}

func (q *qp) toError() error {
	if rc := C.kvf_to_error(q.c); rc != 0 {
		return errnoErr(errdefs.Internal, "modify QP to ERROR", rc)
	}
	return nil
}

func (q *qp) destroy() error {
	if rc := C.ibv_destroy_qp(q.c); rc != 0 {
		return errnoErr(errdefs.Internal, "ibv_destroy_qp", rc)
	}
	return nil
}

func (m *mw) dealloc() error {
	if rc := C.ibv_dealloc_mw(m.c); rc != 0 {
		return errnoErr(errdefs.Internal, "ibv_dealloc_mw", rc)
	}
	return nil
}
