package verbs

import (
	"crypto/rand"
	"encoding/binary"

	"github.com/kvfence/kvfence/sdk"
)

// A Key names one exposure. Every exposure is its own MR (or memory window
// over its own MR) registered with an iova that starts at the window's page
// offset, so a sender needs no other information than the key:
//
//	bits  0..31  rkey of the MR or memory window
//	bits 32..43  iova of the window's first byte (its offset within a page)
//	bits 44..63  random nonce, never zero (so no key is zero and a guessed
//	             key must match the device's rkey and the nonce)
//
// The remote address of window offset o is iova + o. The device enforces the
// bounds (the MR/MW covers exactly the window) and the key's validity, so a
// sender's wrong key or range ends with a remote access error, never with
// bytes outside the window.
func makeKey(rkey uint32, iova uint64, nonce uint32) sdk.Key {
	n := uint64(nonce) & 0xfffff
	if n == 0 {
		n = 1
	}
	return sdk.Key(uint64(rkey) | (iova&0xfff)<<32 | n<<44)
}

func keyRKey(k sdk.Key) uint32  { return uint32(k) }
func keyIOVA(k sdk.Key) uint64  { return (uint64(k) >> 32) & 0xfff }
func keyNonce(k sdk.Key) uint32 { return uint32(uint64(k) >> 44) }

func randomNonce() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:])
}

// remoteAddr is where window offset off of key k lies in the exposure's
// address space; ok is false on overflow.
func remoteAddr(k sdk.Key, off, length uint64) (uint64, bool) {
	a := keyIOVA(k) + off
	if a < off || a+length < a {
		return 0, false
	}
	return a, true
}
