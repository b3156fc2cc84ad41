package oracle

import "testing"

// The oracle tells a page's owner apart from any other request's bytes.
func TestOracleDetectsForeignBytes(t *testing.T) {
	a := PageIdentity{Room: 1, Gen: 1, Page: 3, Rank: 1}
	b := PageIdentity{Room: 2, Gen: 1, Page: 3, Rank: 1}
	buf := make([]byte, 4096)
	FillShard(buf, a)
	if ok, _ := VerifyShard(buf, a); !ok {
		t.Fatal("own content refused")
	}
	if ok, owner := VerifyShard(buf, b); ok || owner != a {
		t.Fatalf("foreign content accepted (ok=%v owner=%+v)", ok, owner)
	}
	buf[2000] ^= 1
	if ok, _ := VerifyShard(buf, a); ok {
		t.Fatal("torn content accepted")
	}
}
