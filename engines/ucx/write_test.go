package ucx

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

func TestWriteSizesByteExact(t *testing.T) {
	for _, mode := range allModes() {
		t.Run(mode.String(), func(t *testing.T) {
			const size = 40 << 20
			p := newPair(t, mode, size)
			sizes := []uint64{1, 3, 4095, 4096, 4097, 64<<10 + 3, DefaultFragmentSize + 1, 1<<20 + 5, 16 << 20}
			for i, n := range sizes {
				srcOff, dstOff := uint64(i*13+1), uint64(i*29+3)
				src := p.abuf.Bytes()
				dst := p.bbuf.Bytes()
				fill(src[srcOff:srcOff+n], uint64(i+1))
				clear(dst)
				op, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: desc(p.abuf, srcOff, n), Dst: desc(p.bbuf, dstOff, n)}})
				if err != nil {
					t.Fatalf("size %d: %v", n, err)
				}
				mustDone(t, op)
				if !bytes.Equal(dst[dstOff:dstOff+n], src[srcOff:srcOff+n]) {
					t.Fatalf("size %d: destination bytes differ", n)
				}
				if !allZero(dst[:dstOff]) || !allZero(dst[dstOff+n:]) {
					t.Fatalf("size %d: bytes outside the destination changed", n)
				}
			}
		})
	}
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

func TestMultiOpPost(t *testing.T) {
	for _, mode := range allModes() {
		t.Run(mode.String(), func(t *testing.T) {
			const size = 8 << 20
			p := newPair(t, mode, size)
			fill(p.abuf.Bytes(), 7)
			// 2000 ops of varied sizes, destinations in reverse order with
			// gaps, sources at odd offsets.
			var ops []transfer.WriteOp
			var srcOff uint64 = 1
			dstOff := uint64(size)
			for i := 0; i < 2000; i++ {
				n := uint64(1 + (i*97)%3000)
				dstOff -= n + uint64(i%5)
				ops = append(ops, transfer.WriteOp{Src: desc(p.abuf, srcOff, n), Dst: desc(p.bbuf, dstOff, n)})
				srcOff += n + 3
			}
			op, err := p.a.PostWrite("b", ops)
			if err != nil {
				t.Fatal(err)
			}
			mustDone(t, op)
			want := make([]byte, size)
			for _, o := range ops {
				copy(want[o.Dst.Addr-p.bbuf.Desc().Addr:], p.abuf.Bytes()[o.Src.Addr-p.abuf.Desc().Addr:][:o.Src.Len])
			}
			if !bytes.Equal(p.bbuf.Bytes(), want) {
				t.Fatal("destination differs from the expected scatter")
			}
		})
	}
}

func TestConcurrentPosts(t *testing.T) {
	for _, mode := range allModes() {
		t.Run(mode.String(), func(t *testing.T) {
			const workers, per, chunk = 8, 16, 64 << 10
			p := newPair(t, mode, workers*per*chunk)
			fill(p.abuf.Bytes(), 11)
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < per; i++ {
						off := uint64((w*per + i) * chunk)
						op, err := p.a.PostWrite("b", []transfer.WriteOp{
							{Src: desc(p.abuf, off, chunk/2), Dst: desc(p.bbuf, off, chunk/2)},
							{Src: desc(p.abuf, off+chunk/2, chunk/2), Dst: desc(p.bbuf, off+chunk/2, chunk/2)},
						})
						if err != nil {
							errs <- err
							return
						}
						if s, err := wait(t, op); s != transfer.Done {
							errs <- fmt.Errorf("worker %d op %d: %v %v", w, i, s, err)
							return
						}
						op.Release()
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if !bytes.Equal(p.abuf.Bytes(), p.bbuf.Bytes()) {
				t.Fatal("destination differs")
			}
		})
	}
}

func TestRejectedWritesPostNothing(t *testing.T) {
	const size = 1 << 20
	other := alloc(t, size) // registered nowhere
	p := newPair(t, PeerErrors, size)
	fill(p.abuf.Bytes(), 3)
	good := transfer.WriteOp{Src: desc(p.abuf, 0, 4096), Dst: desc(p.bbuf, 0, 4096)}
	cases := []struct {
		name string
		bad  transfer.WriteOp
		want error
	}{
		{"unregistered src", transfer.WriteOp{Src: desc(other, 0, 16), Dst: desc(p.bbuf, 8192, 16)}, transfer.ErrNotRegistered},
		{"src past end", transfer.WriteOp{Src: desc(p.abuf, size-8, 16), Dst: desc(p.bbuf, 8192, 16)}, transfer.ErrOutOfBounds},
		{"dst not peer memory", transfer.WriteOp{Src: desc(p.abuf, 0, 16), Dst: desc(other, 0, 16)}, transfer.ErrNotRegistered},
		{"dst past end", transfer.WriteOp{Src: desc(p.abuf, 0, 16), Dst: desc(p.bbuf, size-8, 16)}, transfer.ErrOutOfBounds},
		{"dst wraps", transfer.WriteOp{Src: desc(p.abuf, 0, 16), Dst: transfer.Desc{Addr: ^uint64(0) - 4, Len: 16}}, transfer.ErrNotRegistered},
		{"length mismatch", transfer.WriteOp{Src: desc(p.abuf, 0, 16), Dst: desc(p.bbuf, 0, 17)}, transfer.ErrOutOfBounds},
		{"cuda src", transfer.WriteOp{Src: transfer.Desc{Addr: 4096, Len: 16, Kind: transfer.CUDA}, Dst: desc(p.bbuf, 0, 16)}, transfer.ErrUnsupported},
	}
	for _, c := range cases {
		op, err := p.a.PostWrite("b", []transfer.WriteOp{good, c.bad})
		if op != nil || !errors.Is(err, c.want) {
			t.Errorf("%s: PostWrite = %v, %v; want error %v", c.name, op, err, c.want)
		}
	}
	if _, err := p.a.PostWrite("nobody", []transfer.WriteOp{good}); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Errorf("unknown peer: %v", err)
	}
	if _, err := p.a.PostWrite("b", nil); err == nil {
		t.Error("empty post accepted")
	}
	// Prove nothing moved: a flush-only write completes after everything
	// posted before it, and the good op's destination is still zero.
	op, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: desc(p.abuf, 0, 0), Dst: desc(p.bbuf, 0, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op)
	if !allZero(p.bbuf.Bytes()) {
		t.Fatal("a rejected post wrote bytes")
	}
	// No rejected post left a reference behind.
	if err := p.a.DeregisterMemory(p.abuf.Desc()); err != nil {
		t.Fatalf("deregister after rejected posts: %v", err)
	}
}

func TestReloadRefreshesRanges(t *testing.T) {
	extra := alloc(t, 64<<10)
	p := newPair(t, PeerErrors, 1<<20)
	register(t, p.b, extra)
	fill(p.abuf.Bytes()[:4096], 5)
	w := []transfer.WriteOp{{Src: desc(p.abuf, 0, 4096), Dst: desc(extra, 100, 4096)}}
	if _, err := p.a.PostWrite("b", w); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("write to range registered after load: %v, want ErrNotRegistered", err)
	}
	load(t, p.a, p.b)
	op, err := p.a.PostWrite("b", w)
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op)
	if !bytes.Equal(extra.Bytes()[100:4196], p.abuf.Bytes()[:4096]) {
		t.Fatal("destination differs after reload")
	}
	// After b deregisters and a reloads, the range is gone again.
	if err := p.b.DeregisterMemory(extra.Desc()); err != nil {
		t.Fatal(err)
	}
	load(t, p.a, p.b)
	if _, err := p.a.PostWrite("b", w); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("write to deregistered range: %v, want ErrNotRegistered", err)
	}
}

func TestRegisterErrors(t *testing.T) {
	b := alloc(t, 1<<20)
	e := newEngine(t, Config{Name: "r"})
	register(t, e, b)
	register(t, e, b) // same range again: no-op
	if err := e.RegisterMemory(desc(b, 4096, 4096)); err == nil {
		t.Error("overlapping range accepted")
	}
	if err := e.RegisterMemory(transfer.Desc{Addr: 4096, Len: 4096, Kind: transfer.CUDA}); !errors.Is(err, transfer.ErrUnsupported) {
		t.Errorf("cuda: %v", err)
	}
	if err := e.DeregisterMemory(desc(b, 0, 4096)); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Errorf("deregister part: %v", err)
	}
	if err := e.DeregisterMemory(b.Desc()); err != nil {
		t.Fatal(err)
	}
	if err := e.DeregisterMemory(b.Desc()); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Errorf("deregister twice: %v", err)
	}
}

// TestEndpointTransports records which transports UCX picks: with peer
// error handling UCX 1.13 never uses the shared-memory transports.
func TestEndpointTransports(t *testing.T) {
	for _, mode := range allModes() {
		p := newPair(t, mode, 4096)
		op, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: p.abuf.Desc(), Dst: p.bbuf.Desc()}})
		if err != nil {
			t.Fatal(err)
		}
		mustDone(t, op)
		info, err := p.a.EndpointInfo("b")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("error mode %v:\n%s", mode, info)
		if mode == PeerErrors && (strings.Contains(info, "sysv/") || strings.Contains(info, "posix/") || !strings.Contains(info, "lane[0]")) {
			t.Errorf("peer error mode endpoint uses shared memory or has no lanes:\n%s", info)
		}
		if _, err := p.a.EndpointInfo("nobody"); !errors.Is(err, transfer.ErrUnknownPeer) {
			t.Errorf("unknown peer: %v", err)
		}
	}
}

// TestSmallFragments splits writes into many 4 KiB puts, fragment borders
// falling at unaligned addresses.
func TestSmallFragments(t *testing.T) {
	abuf, bbuf := alloc(t, 2<<20), alloc(t, 2<<20)
	a := newEngine(t, Config{Name: "a", FragmentSize: 4096})
	b := newEngine(t, Config{Name: "b"})
	register(t, a, abuf)
	register(t, b, bbuf)
	load(t, a, b)
	fill(abuf.Bytes(), 17)
	const n = 1<<20 + 17
	op, err := a.PostWrite("b", []transfer.WriteOp{
		{Src: desc(abuf, 5, n), Dst: desc(bbuf, 1001, n)},
		{Src: desc(abuf, 0, 3), Dst: desc(bbuf, 0, 3)},
	})
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op)
	if !bytes.Equal(bbuf.Bytes()[1001:1001+n], abuf.Bytes()[5:5+n]) || !bytes.Equal(bbuf.Bytes()[:3], abuf.Bytes()[:3]) {
		t.Fatal("destination bytes differ")
	}
	if !allZero(bbuf.Bytes()[3:1001]) || !allZero(bbuf.Bytes()[1001+n:]) {
		t.Fatal("bytes outside the destinations changed")
	}
}
