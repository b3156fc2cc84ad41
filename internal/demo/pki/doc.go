// Package pki makes and loads a throwaway certificate authority and one
// certificate per control-plane identity (the common name is the identity:
// router, decode-0, prefill-1, ...), for a demo run or a test on loopback.
// It must never be used for production keys, and imports nothing of the
// runtime, so the runtime's own tests can use it.
package pki
