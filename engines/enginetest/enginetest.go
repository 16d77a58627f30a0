// Package enginetest holds the small helpers the engine packages' tests
// share: making one engine know another, and registering a buffer.
package enginetest

import (
	"testing"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// Load makes to known to from: from loads to's metadata, and the peer name
// it reports must be to's.
func Load(t testing.TB, from, to transfer.Engine) {
	t.Helper()
	md, err := to.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	name, err := from.LoadPeer(md)
	if err != nil {
		t.Fatalf("%s: load %s: %v", from.Name(), to.Name(), err)
	}
	if name != to.Name() {
		t.Fatalf("LoadPeer returned %q, want %q", name, to.Name())
	}
}

// Register registers b with e.
func Register(t testing.TB, e transfer.Engine, b *mem.Buffer) {
	t.Helper()
	if err := e.RegisterMemory(b.Desc()); err != nil {
		t.Fatalf("%s: register: %v", e.Name(), err)
	}
}
