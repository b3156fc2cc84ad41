package verbs

// The device layer: plain values that cross between the transport (pure Go)
// and the libibverbs binding (ibv.go with the "rdma" tag, ibv_stub.go
// without). The binding only moves these values in and out of libibverbs;
// every decision is taken in pure Go.

// Access flags, equal to enum ibv_access_flags (checked in ibv.go).
const (
	accLocalWrite  = 1
	accRemoteWrite = 2
	accRemoteRead  = 4
	accMWBind      = 16
)

// devInfo describes the opened device and port 1.
type devInfo struct {
	Name      string
	GID       [16]byte
	GIDIndex  int
	MW1       bool // IBV_DEVICE_MEM_WINDOW: type 1 windows
	MW2A      bool
	MW2B      bool
	MaxRdAtom int
	MTU       int // enum ibv_mtu of the active port
}

// qpAttrs is what one side of a handshake tells the other.
type qpAttrs struct {
	QPN uint32   `json:"qpn"`
	PSN uint32   `json:"psn"`
	GID [16]byte `json:"gid"`
}

// wr is one RDMA WRITE or READ work request (one SGE). Signal: posted
// signalled (the transport signals the last request of each batch only;
// see epoch).
type wr struct {
	LAddr  uint64
	Len    uint32
	LKey   uint32
	RAddr  uint64
	RKey   uint32
	Read   bool
	Signal bool
	ID     uint64
}

// wc is one work completion.
type wc struct {
	ID     uint64
	Status WCStatus
	QPN    uint32
}
