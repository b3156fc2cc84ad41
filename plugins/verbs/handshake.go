package verbs

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"time"

	"github.com/kvfence/kvfence/errdefs"
)

// The handshake connects one RC queue pair pair: the sender dials the
// receiver's listener and sends its qpAttrs as one JSON line; the receiver
// creates a QP for this sender, moves it to RTR/RTS towards the sender's,
// and answers with its own qpAttrs. The TCP connection then stays open for
// the life of the pair: when it closes, the receiver destroys its QP, so a
// sender that quiesced or died leaves no responder behind.
//
// Every error here is classified (errdefs): a connection that fails or
// times out is Unavailable, a line that is not a hello is InvalidArgument,
// and a receiver that refuses a sender says why and with which class
// (hello.Err, hello.Class), which the sender's Connect or Post returns.

const handshakeTimeout = 10 * time.Second

type hello struct {
	qpAttrs
	// From: the sender's LocalEndpoint address, which a receiver matches
	// against sdk.Window.Writer to bind a key to this connection.
	From string `json:"from,omitempty"`
	Err  string `json:"err,omitempty"`
	// Class classifies Err (by name; a receiver that sends none is read
	// as Unavailable).
	Class errdefs.Class `json:"class,omitempty"`
}

// refusal is the hello a receiver answers with when it cannot connect a
// responder QP for the sender.
func refusal(err error) hello {
	msg := err.Error()
	var e *errdefs.Error
	if errors.As(err, &e) {
		msg = e.Msg // the class travels in Class, not twice in the text
	}
	return hello{Err: msg, Class: errdefs.ClassOf(err)}
}

func writeHello(c net.Conn, h hello) error {
	b, err := json.Marshal(h)
	if err != nil {
		return errdefs.Errorf(errdefs.Internal, "verbs: handshake: encode hello: %v", err)
	}
	_ = c.SetWriteDeadline(time.Now().Add(handshakeTimeout))
	_, err = c.Write(append(b, '\n'))
	_ = c.SetWriteDeadline(time.Time{})
	if err != nil {
		return errdefs.Errorf(errdefs.Unavailable, "verbs: handshake: write: %v", err)
	}
	return nil
}

func readHello(r *bufio.Reader, c net.Conn) (hello, error) {
	_ = c.SetReadDeadline(time.Now().Add(handshakeTimeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	line, err := r.ReadBytes('\n')
	if err != nil {
		return hello{}, errdefs.Errorf(errdefs.Unavailable, "verbs: handshake: read: %v", err)
	}
	if len(line) > 4096 {
		return hello{}, errdefs.Errorf(errdefs.InvalidArgument, "verbs: handshake: line of %d bytes, at most 4096", len(line))
	}
	var h hello
	if err := json.Unmarshal(line, &h); err != nil {
		return hello{}, errdefs.Errorf(errdefs.InvalidArgument, "verbs: handshake: not a hello: %v", err)
	}
	return h, nil
}

// exchangeHellos is the sender's half of the handshake on nc: send mine,
// read the receiver's answer. A refusal comes back with the receiver's
// class; a broken exchange is Unavailable (the peer could not be used; the
// caller's endpoint was fine).
func exchangeHellos(nc net.Conn, addr string, mine hello) (hello, error) {
	if err := writeHello(nc, mine); err != nil {
		return hello{}, errdefs.Errorf(errdefs.Unavailable, "verbs: handshake with %s: %v", addr, err)
	}
	h, err := readHello(bufio.NewReader(nc), nc)
	if err != nil {
		return hello{}, errdefs.Errorf(errdefs.Unavailable, "verbs: handshake with %s: %v", addr, err)
	}
	if h.Err != "" {
		class := h.Class
		if class == errdefs.Unknown {
			class = errdefs.Unavailable
		}
		return hello{}, errdefs.Errorf(class, "verbs: handshake with %s: refused: %s", addr, h.Err)
	}
	return h, nil
}
