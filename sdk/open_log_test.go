package sdk

import "testing"

// The tail is the last non-empty line; a JSON log line gives its message.
func TestStderrTail(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"first\nsecond\n\n", "second"},
		{"first\nunfinished", "unfinished"},
		{`{"@level":"error","@message":"cannot load libfoo.so","error":"no such file"}` + "\n", "cannot load libfoo.so: no such file"},
		{`{"@level":"info","@message":"up"}` + "\n", "up"},
	} {
		var s stderrTail
		_, _ = s.Write([]byte(c.in))
		if got := s.last(); got != c.want {
			t.Errorf("%q: %q, want %q", c.in, got, c.want)
		}
	}
}
