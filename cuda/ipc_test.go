package cuda_test

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/internal/childproc"
)

const (
	ipcRoleEnv   = "BOUNCE_CUDA_IPC_ROLE"
	ipcHandleEnv = "BOUNCE_CUDA_IPC_HANDLE"
	ipcSize      = 1<<20 + 4096
)

func TestMain(m *testing.M) {
	if role := childproc.Role(ipcRoleEnv); role != "" {
		if err := ipcChild(role); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// pattern is the bytes a seed fills a test allocation with.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ byte(i>>11) ^ seed
	}
	return b
}

// ipcChild is the other process: "import" opens the parent's allocation,
// checks its bytes, overwrites them with seed 2's and closes it; "export"
// allocates and fills memory, prints its handle and waits to be killed.
func ipcChild(role string) error {
	drv, err := cuda.Open("")
	if err != nil {
		return err
	}
	c, err := drv.Primary(0)
	if err != nil {
		return err
	}
	switch role {
	case "import":
		raw, err := hex.DecodeString(os.Getenv(ipcHandleEnv))
		if err != nil || len(raw) != cuda.IPCHandleSize {
			return fmt.Errorf("bad handle %q: %v", os.Getenv(ipcHandleEnv), err)
		}
		var h cuda.IPCHandle
		copy(h[:], raw)
		p, err := c.OpenIPC(h)
		if err != nil {
			return err
		}
		got := make([]byte, ipcSize)
		if err := c.CopyDtoH(got, p); err != nil {
			return err
		}
		if d := cudatest.Diff(got, pattern(ipcSize, 1)); d != "" {
			return fmt.Errorf("imported bytes: %s", d)
		}
		if err := c.CopyHtoD(p, pattern(ipcSize, 2)); err != nil {
			return err
		}
		if err := c.CloseIPC(p); err != nil {
			return err
		}
		fmt.Println("ok")
		return nil
	case "export":
		p, err := c.MemAlloc(ipcSize)
		if err != nil {
			return err
		}
		if err := c.CopyHtoD(p, pattern(ipcSize, 3)); err != nil {
			return err
		}
		h, err := c.IPCHandle(p)
		if err != nil {
			return err
		}
		fmt.Println("handle", h)
		bufio.NewReader(os.Stdin).ReadString('\n') // until killed
		return nil
	}
	return fmt.Errorf("unknown role %q", role)
}

func ipcContext(t *testing.T) *cuda.Context {
	c := cudatest.Context(t)
	if !c.Driver().HasIPC() {
		t.Skip("skipping: the driver exports no CUDA IPC calls")
	}
	return c
}

// TestIPCAcrossProcesses: a child process opens this process's allocation
// by handle, reads exactly its bytes and writes new ones this process then
// reads; this process cannot open its own handle (an error, not a crash).
func TestIPCAcrossProcesses(t *testing.T) {
	c := ipcContext(t)
	d := cudatest.Device(t, c, ipcSize)
	if err := c.CopyHtoD(cuda.DevicePtr(d.Addr), pattern(ipcSize, 1)); err != nil {
		t.Fatal(err)
	}
	h, err := c.IPCHandle(cuda.DevicePtr(d.Addr))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.OpenIPC(h); err == nil {
		t.Fatal("OpenIPC of this process's own handle succeeded; the driver refuses it")
	}
	child := childproc.Start(t, ipcRoleEnv, "import", ipcHandleEnv+"="+h.String())
	line, err := child.Next(60 * time.Second)
	if err != nil || line != "ok" {
		t.Fatalf("child: %q, %v", line, err)
	}
	if err := child.Wait(); err != nil {
		t.Fatalf("child exit: %v", err)
	}
	if diff := cudatest.Diff(cudatest.Read(t, c, d), pattern(ipcSize, 2)); diff != "" {
		t.Fatalf("bytes the child wrote: %s", diff)
	}
}

// TestIPCExporterKilled: this process opens a child's allocation, reads
// its bytes, and the child is killed -9 while the mapping is open: copies
// from the dead process's memory may fail but never crash this one, the
// close returns, and this process's context keeps serving.
func TestIPCExporterKilled(t *testing.T) {
	c := ipcContext(t)
	child := childproc.Start(t, ipcRoleEnv, "export")
	line, err := child.Next(60 * time.Second)
	if err != nil || !strings.HasPrefix(line, "handle ") {
		t.Fatalf("child: %q, %v", line, err)
	}
	raw, err := hex.DecodeString(strings.TrimPrefix(line, "handle "))
	if err != nil || len(raw) != cuda.IPCHandleSize {
		t.Fatalf("handle line %q: %v", line, err)
	}
	var h cuda.IPCHandle
	copy(h[:], raw)
	p, err := c.OpenIPC(h)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, ipcSize)
	if err := c.CopyDtoH(got, p); err != nil {
		t.Fatal(err)
	}
	if d := cudatest.Diff(got, pattern(ipcSize, 3)); d != "" {
		t.Fatalf("imported bytes: %s", d)
	}
	if err := child.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	err = c.CopyDtoH(got, p)
	t.Logf("copy from a killed exporter's memory: %v", err)
	t.Logf("close of a killed exporter's handle: %v", c.CloseIPC(p))
	own := cudatest.Device(t, c, 4096)
	want := cudatest.Fill(t, c, own, 9)
	if d := cudatest.Diff(cudatest.Read(t, c, own), want); d != "" {
		t.Fatalf("context after the exporter died: %s", d)
	}
	var ce *cuda.Error
	if err != nil && !errors.As(err, &ce) {
		t.Fatalf("copy error %v is no driver error", err)
	}
}
