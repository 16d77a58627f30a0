package cudacopy_test

import (
	"errors"
	"testing"
	"time"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/engines/cudacopy"
	"github.com/bouncekv/bounce/engines/enginetest"
	"github.com/bouncekv/bounce/transfer"
)

func TestNoDriverIsUnavailable(t *testing.T) {
	f := cudacopy.NewFabric(&cuda.Lib{Path: "libcuda-missing.so.1"})
	_, err := f.NewEngine(cudacopy.Config{Name: "a"})
	if !errors.Is(err, cuda.ErrUnavailable) {
		t.Fatalf("NewEngine without a driver = %v, want ErrUnavailable", err)
	}
}

func pair(t *testing.T, batch bool) (*cudacopy.Engine, *cudacopy.Engine, *cuda.Context) {
	c := cudatest.Context(t)
	f := cudacopy.NewFabric(nil)
	a, err := f.NewEngine(cudacopy.Config{Name: "a", Batch: batch})
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.NewEngine(cudacopy.Config{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("close a: %v", err)
		}
		if err := b.Close(); err != nil {
			t.Errorf("close b: %v", err)
		}
	})
	enginetest.Load(t, a, b)
	enginetest.Load(t, b, a)
	return a, b, c
}

func wait(t *testing.T, op transfer.Op) (transfer.Status, error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if s, err := op.Poll(); s.Terminal() {
			return s, err
		}
		if time.Now().After(deadline) {
			t.Fatal("write never became terminal")
		}
	}
}

// TestWritesDeviceToDevice posts many small scattered writes (one
// operation, per-descriptor copies or batched) and checks every byte.
func TestWritesDeviceToDevice(t *testing.T) {
	for _, batch := range []bool{false, true} {
		a, b, c := pair(t, batch)
		if batch && !a.Batched() {
			t.Log("driver has no cuMemcpyBatchAsync: batch falls back to per-descriptor copies")
		}
		const n, size = 5000, 1000
		src := cudatest.Device(t, c, n*size)
		dst := cudatest.Device(t, c, n*size+7)
		if err := a.RegisterMemory(src); err != nil {
			t.Fatal(err)
		}
		if err := b.RegisterMemory(dst); err != nil {
			t.Fatal(err)
		}
		want := cudatest.Fill(t, c, src, 3)
		got0 := cudatest.Fill(t, c, dst, 4)
		ops := make([]transfer.WriteOp, n)
		for i := range ops {
			// Reverse order, shifted by 7 bytes: unaligned destinations.
			ops[i] = transfer.WriteOp{
				Src: transfer.Desc{Addr: src.Addr + uint64(i)*size, Len: size, Kind: transfer.CUDA},
				Dst: transfer.Desc{Addr: dst.Addr + 7 + uint64(n-1-i)*size, Len: size, Kind: transfer.CUDA},
			}
		}
		op, err := a.PostWrite("b", ops)
		if err != nil {
			t.Fatal(err)
		}
		if s, err := wait(t, op); s != transfer.Done {
			t.Fatalf("write %v: %v", s, err)
		}
		if err := op.Release(); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			copy(got0[7+(n-1-i)*size:], want[i*size:(i+1)*size])
		}
		if d := cudatest.Diff(cudatest.Read(t, c, dst), got0); d != "" {
			t.Fatalf("batch=%v: %s", batch, d)
		}
		if err := a.DeregisterMemory(src); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRefusesUnregisteredAndForeignMemory(t *testing.T) {
	a, b, c := pair(t, false)
	src := cudatest.Device(t, c, 4096)
	dst := cudatest.Device(t, c, 4096)
	if err := a.RegisterMemory(src); err != nil {
		t.Fatal(err)
	}
	w := transfer.WriteOp{Src: transfer.Desc{Addr: src.Addr, Len: 100, Kind: transfer.CUDA}, Dst: transfer.Desc{Addr: dst.Addr, Len: 100, Kind: transfer.CUDA}}
	if _, err := a.PostWrite("b", []transfer.WriteOp{w}); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("write to unregistered destination = %v", err)
	}
	if err := b.RegisterMemory(dst); err != nil {
		t.Fatal(err)
	}
	// A descriptor that names host memory at a device address (as the
	// pipeline does for a peer's device arena, whose kind no GRANT
	// carries) is copied as the device memory the peer registered.
	want := cudatest.Fill(t, c, src, 9)
	lie := w
	lie.Dst.Kind = transfer.Host
	op, err := a.PostWrite("b", []transfer.WriteOp{lie})
	if err != nil {
		t.Fatalf("host-kind descriptor over registered device memory = %v", err)
	}
	if s, err := wait(t, op); s != transfer.Done {
		t.Fatalf("write %v: %v", s, err)
	}
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
	if d := cudatest.Diff(cudatest.Read(t, c, dst)[:100], want[:100]); d != "" {
		t.Fatalf("copy by registered kind: %s", d)
	}
	past := w
	past.Dst.Addr = dst.Addr + 4000
	if _, err := a.PostWrite("b", []transfer.WriteOp{past}); !errors.Is(err, transfer.ErrOutOfBounds) {
		t.Fatalf("write past the destination = %v", err)
	}
	// Device memory of another device ordinal is refused at registration.
	other := src
	other.Device = 5
	if err := a.RegisterMemory(other); !errors.Is(err, transfer.ErrUnsupported) {
		t.Fatalf("register memory of device 5 = %v", err)
	}
	if _, err := a.PostWrite("c", []transfer.WriteOp{w}); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("write to unknown peer = %v", err)
	}
	if err := a.ForgetPeer("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PostWrite("b", []transfer.WriteOp{w}); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("write to forgotten peer = %v", err)
	}
}

func TestMetadataRejectsGarbage(t *testing.T) {
	a, _, _ := pair(t, false)
	for _, md := range [][]byte{nil, []byte("BCMD"), []byte("XXXX\x01aaaaaaaabbbbbbbb\x01\x00a")} {
		if _, err := a.LoadPeer(md); !errors.Is(err, transfer.ErrBadMetadata) {
			t.Fatalf("LoadPeer(%q) = %v", md, err)
		}
	}
}

// TestTargetForgetFences: once the target forgets the writer, the
// writer's posts are refused until the target loads it again; a write
// held before its copies were queued and then forgotten moves nothing.
func TestTargetForgetFences(t *testing.T) {
	c := cudatest.Context(t)
	f := cudacopy.NewFabric(nil)
	gate := make(chan struct{})
	a, err := f.NewEngine(cudacopy.Config{Name: "a", Hold: func(abort <-chan struct{}) {
		select {
		case <-gate:
		case <-abort:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := f.NewEngine(cudacopy.Config{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	enginetest.Load(t, a, b)
	enginetest.Load(t, b, a)
	src, dst := cudatest.Device(t, c, 4096), cudatest.Device(t, c, 4096)
	if err := a.RegisterMemory(src); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterMemory(dst); err != nil {
		t.Fatal(err)
	}
	cudatest.Fill(t, c, src, 1)
	before := cudatest.Fill(t, c, dst, 2)
	w := []transfer.WriteOp{{Src: src, Dst: dst}}
	held, err := a.PostWrite("b", w)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := held.Poll(); s != transfer.Pending {
		t.Fatalf("held write %v, want pending", s)
	}
	if err := b.ForgetPeer("a"); err != nil {
		t.Fatal(err)
	}
	if s, err := wait(t, held); s != transfer.Failed || !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("held write after the target forgot the writer: %v, %v", s, err)
	}
	if d := cudatest.Diff(cudatest.Read(t, c, dst), before); d != "" {
		t.Fatalf("a forgotten held write moved bytes: %s", d)
	}
	if err := held.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PostWrite("b", w); !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("post after the target forgot the writer = %v, want ErrPeerLost", err)
	}
	close(gate)
	enginetest.Load(t, b, a)
	op, err := a.PostWrite("b", w)
	if err != nil {
		t.Fatalf("post after the target loaded the writer again: %v", err)
	}
	if s, err := wait(t, op); s != transfer.Done {
		t.Fatalf("write %v: %v", s, err)
	}
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
}
