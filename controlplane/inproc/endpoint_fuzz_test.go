package inproc

import (
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

// FuzzParseEndpoint checks that parsing never panics and that an accepted
// endpoint is exactly the scheme followed by a valid name.
func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{"inproc://a", "inproc://", "tcp://127.0.0.1:1", "inproc://a\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		name, err := parseEndpoint(s)
		if err != nil {
			return
		}
		if Scheme+name != s || transfer.CheckName(name) != nil {
			t.Fatalf("accepted %q as name %q", s, name)
		}
	})
}
