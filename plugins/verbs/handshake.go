package verbs

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"time"
)

// The handshake connects one RC queue pair pair: the sender dials the
// receiver's listener and sends its qpAttrs as one JSON line; the receiver
// creates a QP for this sender, moves it to RTR/RTS towards the sender's,
// and answers with its own qpAttrs. The TCP connection then stays open for
// the life of the pair: when it closes, the receiver destroys its QP, so a
// sender that quiesced or died leaves no responder behind.

const handshakeTimeout = 10 * time.Second

type hello struct {
	qpAttrs
	// From: the sender's LocalEndpoint address, which a receiver matches
	// against sdk.Window.Writer to bind a key to this connection.
	From string `json:"from,omitempty"`
	Err  string `json:"err,omitempty"`
}

func writeHello(c net.Conn, h hello) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	_ = c.SetWriteDeadline(time.Now().Add(handshakeTimeout))
	_, err = c.Write(append(b, '\n'))
	_ = c.SetWriteDeadline(time.Time{})
	return err
}

func readHello(r *bufio.Reader, c net.Conn) (hello, error) {
	_ = c.SetReadDeadline(time.Now().Add(handshakeTimeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	line, err := r.ReadBytes('\n')
	if err != nil {
		return hello{}, err
	}
	if len(line) > 4096 {
		return hello{}, fmt.Errorf("handshake line too long")
	}
	var h hello
	if err := json.Unmarshal(line, &h); err != nil {
		return hello{}, fmt.Errorf("handshake: %v", err)
	}
	return h, nil
}
