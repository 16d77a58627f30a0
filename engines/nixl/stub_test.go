//go:build !nixl

package nixl

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

func TestNewWithoutNIXLIsUnsupported(t *testing.T) {
	e, err := New(Config{Name: "a"})
	if e != nil {
		t.Fatalf("New returned an engine %v without NIXL", e)
	}
	if !errors.Is(err, transfer.ErrUnsupported) {
		t.Fatalf("New: %v, want an error wrapping ErrUnsupported", err)
	}
	const want = "bounce was built without NIXL support; rebuild with -tags nixl where NIXL is installed (see docs/NIXL.md)"
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("New: %q, want it to say %q", err, want)
	}
}

func TestNewWithoutNIXLStillValidatesConfig(t *testing.T) {
	_, err := New(Config{})
	if err == nil || errors.Is(err, transfer.ErrUnsupported) || !strings.Contains(err.Error(), "Name") {
		t.Fatalf("New with an empty name: %v, want a config error naming Name", err)
	}
}

func TestStubMethodsAreUnsupported(t *testing.T) {
	var e Engine
	_, err1 := e.Metadata()
	_, err2 := e.LoadPeer(nil)
	_, err3 := e.PostWrite("p", nil)
	_, err4 := e.RecvNotification(time.Millisecond)
	for i, err := range []error{
		e.RegisterMemory(transfer.Desc{}), e.DeregisterMemory(transfer.Desc{}), err1, err2,
		e.ForgetPeer("p"), err3, e.Notify("p", nil), err4,
	} {
		if !errors.Is(err, transfer.ErrUnsupported) {
			t.Errorf("call %d: %v, want ErrUnsupported", i, err)
		}
	}
	if err := e.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
