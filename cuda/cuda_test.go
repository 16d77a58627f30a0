package cuda_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
)

func TestOpenMissingLibraryIsUnavailable(t *testing.T) {
	l := &cuda.Lib{Path: "libcuda-does-not-exist.so.1"}
	_, err := l.Open()
	if !errors.Is(err, cuda.ErrUnavailable) {
		t.Fatalf("Open = %v, want an error wrapping ErrUnavailable", err)
	}
	if !strings.HasPrefix(err.Error(), "cuda unavailable: ") || !strings.Contains(err.Error(), "libcuda-does-not-exist.so.1") {
		t.Fatalf("error %q should start with %q and name the library", err, "cuda unavailable: ")
	}
	// Lazy and sticky: the second call gives the same answer.
	if _, err2 := l.Open(); err2 == nil || err2.Error() != err.Error() {
		t.Fatalf("second Open = %v, want %v", err2, err)
	}
}

func TestDriverBasics(t *testing.T) {
	c := cudatest.Context(t)
	v, err := c.Driver().Version()
	if err != nil || v < 12000 {
		t.Fatalf("Version = %d, %v; want >= 12000", v, err)
	}
	name, err := c.Name()
	if err != nil || name == "" {
		t.Fatalf("Name = %q, %v", name, err)
	}
	sms, err := c.Attribute(cuda.AttrMultiprocessorCount)
	if err != nil || sms <= 0 {
		t.Fatalf("multiprocessors = %d, %v", sms, err)
	}
	uva, _ := c.Attribute(cuda.AttrUnifiedAddressing)
	t.Logf("device %d: %s, driver %d, %d SMs, unified addressing %d, batch copy %v", c.Device(), name, v, sms, uva, c.Driver().HasBatchCopy())
	if _, err := c.Driver().Primary(1 << 20); !errors.Is(err, cuda.ErrUnavailable) {
		t.Fatalf("Primary(huge) = %v, want ErrUnavailable", err)
	}
}

func TestMemoryRoundTrip(t *testing.T) {
	c := cudatest.Context(t)
	const n = 1<<20 + 3
	a := cudatest.Device(t, c, n)
	b := cudatest.Device(t, c, n)
	want := cudatest.Fill(t, c, a, 1)
	if err := c.CopyDtoD(cuda.DevicePtr(b.Addr), cuda.DevicePtr(a.Addr), n); err != nil {
		t.Fatal(err)
	}
	if d := cudatest.Diff(cudatest.Read(t, c, b), want); d != "" {
		t.Fatalf("DtoD copy: %s", d)
	}
	if mt, err := c.PointerMemoryType(a.Addr); err != nil || mt != cuda.MemoryTypeDevice {
		t.Fatalf("PointerMemoryType(device) = %d, %v", mt, err)
	}
	base, size, err := c.AddressRange(cuda.DevicePtr(a.Addr + 100))
	if err != nil || uint64(base) != a.Addr || size < n {
		t.Fatalf("AddressRange = %#x+%d, %v; want %#x+>=%d", uint64(base), size, err, a.Addr, n)
	}
	if err := c.Memset(cuda.DevicePtr(b.Addr), 0xab, 10); err != nil {
		t.Fatal(err)
	}
	got := cudatest.Read(t, c, b)
	for i := range 10 {
		if got[i] != 0xab {
			t.Fatalf("memset byte %d = %#x", i, got[i])
		}
	}
}

func TestPinnedHostMemory(t *testing.T) {
	c := cudatest.Context(t)
	d, buf := cudatest.Pinned(t, c, 64<<10)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	if mt, err := c.PointerMemoryType(d.Addr); err != nil || mt != cuda.MemoryTypeHost {
		t.Fatalf("PointerMemoryType(pinned) = %d, %v", mt, err)
	}
	dev := cudatest.Device(t, c, d.Len)
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	ev, err := c.NewEvent(false)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()
	// Pinned host to device through the generic copy, then back into a
	// second pinned buffer, completion by event query.
	if err := s.Copy(cuda.DevicePtr(dev.Addr), cuda.DevicePtr(d.Addr), d.Len); err != nil {
		t.Fatal(err)
	}
	d2, buf2 := cudatest.Pinned(t, c, d.Len)
	if err := s.CopyDtoH(uintptr(d2.Addr), cuda.DevicePtr(dev.Addr), d.Len); err != nil {
		t.Fatal(err)
	}
	if err := ev.Record(s); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		done, err := ev.Query()
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("event never completed")
		}
	}
	if d := cudatest.Diff(buf2, buf); d != "" {
		t.Fatalf("pinned round trip: %s", d)
	}
}

func TestHostRegister(t *testing.T) {
	c := cudatest.Context(t)
	buf, err := unix.Mmap(-1, 0, 3<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	p := addr(buf)
	hm, err := c.HostRegister(p, uint64(len(buf)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.HostDevicePointer(p); err != nil {
		t.Fatalf("registered memory has no device pointer: %v", err)
	}
	if uint64(hm.Dev) != uint64(p) {
		t.Logf("device pointer %#x differs from host %#x", uint64(hm.Dev), p)
	}
	if err := c.HostUnregister(p); err != nil {
		t.Fatal(err)
	}
	if _, err := c.HostDevicePointer(p); err == nil {
		t.Fatal("unregistered memory still has a device pointer")
	}
}

func TestBatchCopy(t *testing.T) {
	c := cudatest.Context(t)
	if !c.Driver().HasBatchCopy() {
		t.Skip("driver has no cuMemcpyBatchAsync")
	}
	b, err := c.NewBatchCopy(64)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	src := cudatest.Device(t, c, 64*100)
	dst := cudatest.Device(t, c, 64*100)
	want := cudatest.Fill(t, c, src, 2)
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	// Reverse the 64 blocks of 100 bytes.
	for i := range 64 {
		b.Set(i, cuda.DevicePtr(dst.Addr+uint64(63-i)*100), cuda.DevicePtr(src.Addr+uint64(i)*100), 100)
	}
	if err := b.Post(s, 64); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	got := cudatest.Read(t, c, dst)
	for i := range 64 {
		if d := cudatest.Diff(got[(63-i)*100:(64-i)*100], want[i*100:(i+1)*100]); d != "" {
			t.Fatalf("block %d: %s", i, d)
		}
	}
}

func TestBadPTXCarriesTheJITLog(t *testing.T) {
	c := cudatest.Context(t)
	_, err := c.LoadPTX([]byte(".version 8.0\n.target sm_80\n.address_size 64\nthis is not ptx\n"))
	if err == nil {
		t.Fatal("bad PTX loaded")
	}
	var ce *cuda.Error
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "cuModuleLoadDataEx") {
		t.Fatalf("error %v should be a *cuda.Error naming cuModuleLoadDataEx", err)
	}
	t.Logf("bad PTX: %v", err)
}
