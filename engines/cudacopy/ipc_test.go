package cudacopy_test

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/engines/cudacopy"
	"github.com/bouncekv/bounce/internal/childproc"
	"github.com/bouncekv/bounce/transfer"
)

const (
	ipcRole = "BOUNCE_CUDACOPY_IPC_ROLE"
	ipcN    = 4096 // descriptors
	ipcSize = 2048 // bytes each
)

func TestMain(m *testing.M) {
	if childproc.Role(ipcRole) != "" {
		if err := ipcPeer(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// ipcPeer is the receiving process: an IPC engine "b" with a registered
// device buffer; it prints its metadata and buffer address, then answers
// "check <seed>" lines (is the buffer the parent's scattered seed?) until
// stdin ends.
func ipcPeer() error {
	f := cudacopy.NewFabric(nil)
	b, err := f.NewEngine(cudacopy.Config{Name: "b", IPC: true})
	if err != nil {
		return err
	}
	defer b.Close()
	c := b.Context()
	p, err := c.MemAlloc(ipcN * ipcSize)
	if err != nil {
		return err
	}
	defer c.MemFree(p)
	if err := c.Memset(p, 0, ipcN*ipcSize); err != nil {
		return err
	}
	dst := transfer.Desc{Addr: uint64(p), Len: ipcN * ipcSize, Kind: transfer.CUDA}
	if err := b.RegisterMemory(dst); err != nil {
		return err
	}
	md, err := b.Metadata()
	if err != nil {
		return err
	}
	fmt.Printf("peer %s %d\n", hex.EncodeToString(md), dst.Addr)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		seed, err := strconv.Atoi(strings.TrimPrefix(sc.Text(), "check "))
		if err != nil {
			return fmt.Errorf("bad line %q", sc.Text())
		}
		got := make([]byte, ipcN*ipcSize)
		if err := c.CopyDtoH(got, p); err != nil {
			return err
		}
		if d := cudatest.Diff(got, scattered(byte(seed))); d != "" {
			fmt.Println("wrong:", d)
			continue
		}
		fmt.Println("ok")
	}
	return sc.Err()
}

// source is the sender's bytes for seed; scattered is where the writes
// put them (descriptor i lands in slot n-1-i).
func source(seed byte) []byte {
	b := make([]byte, ipcN*ipcSize)
	for i := range b {
		b[i] = byte(i*13) ^ byte(i>>12) ^ seed
	}
	return b
}

func scattered(seed byte) []byte {
	s, out := source(seed), make([]byte, ipcN*ipcSize)
	for i := range ipcN {
		copy(out[(ipcN-1-i)*ipcSize:], s[i*ipcSize:(i+1)*ipcSize])
	}
	return out
}

func ipcOps(src, dst uint64) []transfer.WriteOp {
	ops := make([]transfer.WriteOp, ipcN)
	for i := range ops {
		ops[i] = transfer.WriteOp{
			Src: transfer.Desc{Addr: src + uint64(i)*ipcSize, Len: ipcSize, Kind: transfer.CUDA},
			Dst: transfer.Desc{Addr: dst + uint64(ipcN-1-i)*ipcSize, Len: ipcSize, Kind: transfer.CUDA},
		}
	}
	return ops
}

// startPeer starts the receiving process and returns it, its metadata and
// its buffer's address.
func startPeer(t *testing.T) (*childproc.Child, []byte, uint64) {
	ch := childproc.Start(t, ipcRole, "peer")
	line, err := ch.Next(60 * time.Second)
	f := strings.Fields(line)
	if err != nil || len(f) != 3 || f[0] != "peer" {
		t.Fatalf("peer: %q, %v", line, err)
	}
	md, err := hex.DecodeString(f[1])
	if err != nil {
		t.Fatal(err)
	}
	addr, err := strconv.ParseUint(f[2], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return ch, md, addr
}

func ipcSender(t *testing.T) (*cudacopy.Engine, *cuda.Context, transfer.Desc) {
	c := cudatest.Context(t)
	if !c.Driver().HasIPC() {
		t.Skip("skipping: the driver exports no CUDA IPC calls")
	}
	a, err := cudacopy.NewFabric(nil).NewEngine(cudacopy.Config{Name: "a", IPC: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("close a: %v", err)
		}
	})
	src := cudatest.Device(t, c, ipcN*ipcSize)
	if err := a.RegisterMemory(src); err != nil {
		t.Fatal(err)
	}
	return a, c, src
}

func post(t *testing.T, a *cudacopy.Engine, peer string, ops []transfer.WriteOp) (transfer.Status, error) {
	t.Helper()
	op, err := a.PostWrite(peer, ops)
	if err != nil {
		return transfer.Failed, err
	}
	s, err := wait(t, op)
	if rerr := op.Release(); rerr != nil {
		t.Fatal(rerr)
	}
	return s, err
}

// TestIPCWritesIntoAnotherProcess: an engine writes 4,096 scattered
// descriptors into a device buffer of an engine in another process, opened
// by CUDA IPC from its metadata; that process reads exactly the bytes
// written. Out-of-range destinations are refused before anything moves;
// after ForgetPeer the peer's mappings are closed and writes refused; a
// load again opens them again.
func TestIPCWritesIntoAnotherProcess(t *testing.T) {
	a, c, src := ipcSender(t)
	ch, md, dst := startPeer(t)
	if name, err := a.LoadPeer(md); err != nil || name != "b" {
		t.Fatalf("load peer = %q, %v", name, err)
	}
	if n := a.OpenMappings(); n != 1 {
		t.Fatalf("%d peer allocations mapped after LoadPeer, want 1", n)
	}
	if a.FencesForgottenPeers() {
		t.Fatal("an IPC engine claims to fence forgotten peers; it cannot stop another process's copies")
	}
	for seed := 1; seed <= 2; seed++ {
		if err := c.CopyHtoD(cuda.DevicePtr(src.Addr), source(byte(seed))); err != nil {
			t.Fatal(err)
		}
		if s, err := post(t, a, "b", ipcOps(src.Addr, dst)); s != transfer.Done {
			t.Fatalf("seed %d: write %v: %v", seed, s, err)
		}
		fmt.Fprintf(ch.Stdin, "check %d\n", seed)
		if line, err := ch.Next(60 * time.Second); line != "ok" {
			t.Fatalf("seed %d: peer says %q, %v", seed, line, err)
		}
		if seed == 1 { // forget, refuse, load again
			if err := a.ForgetPeer("b"); err != nil {
				t.Fatal(err)
			}
			if n := a.OpenMappings(); n != 0 {
				t.Fatalf("%d peer allocations still mapped after ForgetPeer, want 0", n)
			}
			if _, err := a.PostWrite("b", ipcOps(src.Addr, dst)); !errors.Is(err, transfer.ErrUnknownPeer) && !errors.Is(err, transfer.ErrPeerLost) {
				t.Fatalf("write after ForgetPeer = %v, want ErrUnknownPeer or ErrPeerLost", err)
			}
			if _, err := a.LoadPeer(md); err != nil {
				t.Fatal(err)
			}
			if _, err := a.LoadPeer(md); err != nil { // a reload shares the mapping
				t.Fatal(err)
			}
			if n := a.OpenMappings(); n != 1 {
				t.Fatalf("%d peer allocations mapped after two loads, want 1", n)
			}
		}
	}
	past := []transfer.WriteOp{{Src: transfer.Desc{Addr: src.Addr, Len: 4096, Kind: transfer.CUDA}, Dst: transfer.Desc{Addr: dst + ipcN*ipcSize - 100, Len: 4096, Kind: transfer.CUDA}}}
	if _, err := a.PostWrite("b", past); !errors.Is(err, transfer.ErrOutOfBounds) {
		t.Fatalf("write past the exported range = %v, want ErrOutOfBounds", err)
	}
	outside := past
	outside[0].Dst.Addr = dst - 1<<20
	if _, err := a.PostWrite("b", outside); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("write outside the exported range = %v, want ErrNotRegistered", err)
	}
	// An engine without IPC refuses another process's metadata, naming why.
	plain, err := cudacopy.NewFabric(nil).NewEngine(cudacopy.Config{Name: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.LoadPeer(md); !errors.Is(err, transfer.ErrBadMetadata) || !strings.Contains(err.Error(), "ipc") {
		t.Fatalf("engine without ipc loading another process's metadata = %v", err)
	}
	ch.Stdin.Close()
	if err := ch.Wait(); err != nil {
		t.Fatalf("peer exit: %v", err)
	}
}

// TestIPCPeerKilled: the receiving process is killed -9 with its memory
// mapped here; writes into it still resolve (the driver keeps the memory
// alive while mapped, and nobody reads it), ForgetPeer closes the mappings
// and Close is clean: the survivor never crashes.
func TestIPCPeerKilled(t *testing.T) {
	a, _, src := ipcSender(t)
	ch, md, dst := startPeer(t)
	if _, err := a.LoadPeer(md); err != nil {
		t.Fatal(err)
	}
	op, err := a.PostWrite("b", ipcOps(src.Addr, dst))
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = ch.Wait()
	s, err := wait(t, op)
	t.Logf("write in flight as the peer died: %v, %v", s, err)
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
	s, err = post(t, a, "b", ipcOps(src.Addr, dst))
	t.Logf("write after the peer died: %v, %v", s, err)
	if err := a.ForgetPeer("b"); err != nil {
		t.Fatalf("forget a dead peer: %v", err)
	}
	if n := a.OpenMappings(); n != 0 {
		t.Fatalf("%d mappings of the dead peer still open after ForgetPeer, want 0", n)
	}
}
