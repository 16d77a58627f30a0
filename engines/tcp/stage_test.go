package tcp

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// fakeDevice is a DeviceMemory whose "device" memory is host memory
// registered as CUDA: the copies are memmoves, counted one per call, and
// can be made to fail or to block (fault injection). It records whether a
// staging buffer was freed while a copy was running or while the engine
// still held it, and how often Close ran.
type fakeDevice struct {
	toHost, toDevice atomic.Int64
	failToHost       atomic.Int64 // fail the copy with this 1-based number (0: never)
	failToDevice     atomic.Int64
	failAlloc        int // fail the allocation with this 1-based number

	mu       sync.Mutex
	live     map[uintptr]bool // allocated, not freed
	allocs   int
	closes   int
	active   int      // copies running
	badFrees []string // frees that broke the contract

	block chan struct{} // non-nil: CopyToHost waits on it (closed to release)
	began chan struct{} // signalled when a blocked copy began

	blockIn chan struct{} // under mu; non-nil: CopyToDevice waits on it (closed to release)
	beganIn chan struct{} // under mu; signalled when a blocked CopyToDevice began
}

func newFakeDevice() *fakeDevice { return &fakeDevice{live: map[uintptr]bool{}} }

func (*fakeDevice) Kind() transfer.MemKind { return transfer.CUDA }

// copies runs one copy per pair, counted, the failing one (if any) skipped
// and reported after the rest ran (as a stream's copies all end before
// the call returns).
func (f *fakeDevice) copies(dst, src [][]byte, n *atomic.Int64, fail *atomic.Int64) error {
	f.mu.Lock()
	f.active++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.active--
		f.mu.Unlock()
	}()
	var err error
	for i := range dst {
		if k := n.Add(1); k == fail.Load() {
			err = errors.New("injected copy fault")
			continue
		}
		copy(dst[i], src[i])
	}
	return err
}

func (f *fakeDevice) CopyToHost(dst [][]byte, src []uint64) error {
	if f.block != nil {
		select {
		case f.began <- struct{}{}:
		default:
		}
		<-f.block
	}
	s := make([][]byte, len(src))
	for i := range src {
		s[i] = mem.Unsafe(src[i], uint64(len(dst[i])))
	}
	return f.copies(dst, s, &f.toHost, &f.failToHost)
}

func (f *fakeDevice) CopyToDevice(dst []uint64, src [][]byte) error {
	f.mu.Lock()
	block, began := f.blockIn, f.beganIn
	f.mu.Unlock()
	if block != nil {
		select {
		case began <- struct{}{}:
		default:
		}
		<-block
	}
	d := make([][]byte, len(dst))
	for i := range dst {
		d[i] = mem.Unsafe(dst[i], uint64(len(src[i])))
	}
	return f.copies(d, src, &f.toDevice, &f.failToDevice)
}

func (f *fakeDevice) AllocStaging(n int) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allocs++
	if f.allocs == f.failAlloc {
		return nil, errors.New("injected allocation fault")
	}
	b := make([]byte, n)
	f.live[uintptr(unsafe.Pointer(&b[0]))] = true
	return b, nil
}

func (f *fakeDevice) FreeStaging(b []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := uintptr(unsafe.Pointer(&b[0]))
	if !f.live[p] {
		f.badFrees = append(f.badFrees, fmt.Sprintf("%#x freed twice or never allocated", p))
	}
	if f.active > 0 {
		f.badFrees = append(f.badFrees, fmt.Sprintf("%#x freed while %d copies ran", p, f.active))
	}
	delete(f.live, p)
	return nil
}

func (f *fakeDevice) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closes++
	return nil
}

// checkReleased asserts that every staging buffer was freed, correctly,
// and the device closed once.
func (f *fakeDevice) checkReleased(t *testing.T, allocs int) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.live) != 0 || f.closes != 1 || len(f.badFrees) > 0 || f.allocs != allocs {
		t.Fatalf("after close: %d staging buffers live, %d closes, %d allocated (want %d), bad frees %v", len(f.live), f.closes, f.allocs, allocs, f.badFrees)
	}
}

// devBuf is a buffer registered with e as CUDA memory (host bytes the fake
// device copies).
func (v *env) devBuf(size int, seed uint64, e *Engine) *mem.Buffer {
	v.t.Helper()
	b := v.buf(size, seed, nil)
	d := b.Desc()
	d.Kind = transfer.CUDA
	if err := e.RegisterMemory(d); err != nil {
		v.t.Fatal(err)
	}
	return b
}

func devSub(b *mem.Buffer, off, n int) transfer.Desc {
	d := sub(b, off, n)
	d.Kind = transfer.CUDA
	return d
}

// staged builds a sender and a receiver that carry CUDA memory through the
// fake devices (4 buffers of 64 KiB each way); the test connects them once
// its memory is registered.
func staged(t *testing.T) (*env, *Engine, *Engine, *fakeDevice, *fakeDevice) {
	v := newEnv(t)
	fs, fr := newFakeDevice(), newFakeDevice()
	s := v.engine("s", func(c *Config) { c.Device, c.StageBuffers, c.StageBytes = fs, 4, 64<<10 })
	r := v.engine("r", func(c *Config) { c.Device, c.StageBuffers, c.StageBytes = fr, 4, 64<<10 })
	return v, s, r, fs, fr
}

// Device KV on the direct path: every descriptor is copied to a staging
// buffer on its own (one device-to-host copy each), written, and copied
// out on the receiver (one host-to-device copy each); the bytes land
// exactly and nothing else is touched. Close frees every staging buffer
// once, after the copies, and closes the devices.
func TestStagedDeviceWriteByteExact(t *testing.T) {
	v, s, r, fs, fr := staged(t)
	if k := s.StagedMemoryKinds(); len(k) != 1 || k[0] != transfer.CUDA || transfer.Handles(s, transfer.CUDA) || !transfer.Stages(s, transfer.CUDA) {
		t.Fatalf("StagedMemoryKinds %v, Handles cuda %v: want staged cuda, not native", k, transfer.Handles(s, transfer.CUDA))
	}
	const n, size = 1000, 4096
	src := v.devBuf(2*n*size, 11, s)
	dst := v.devBuf(2*n*size, 0, r)
	connect(t, s, r)
	want := make([]byte, 2*n*size)
	ops := make([]transfer.WriteOp, n)
	for i := range ops { // descriptor i goes from block 2i to block 2n-1-2i
		so, do := 2*i*size, (2*n-1-2*i)*size
		ops[i] = transfer.WriteOp{Src: devSub(src, so, size), Dst: devSub(dst, do, size)}
		copy(want[do:do+size], src.Bytes()[so:so+size])
	}
	op, err := s.PostWrite("r", ops)
	mustDone(t, op, err)
	if !bytes.Equal(dst.Bytes(), want) {
		t.Fatal("destination differs from the expected layout")
	}
	if h, d := fs.toHost.Load(), fr.toDevice.Load(); h != n || d != n {
		t.Fatalf("copies: %d device-to-host on the sender, %d host-to-device on the receiver; want %d each (one per descriptor)", h, d, n)
	}
	if fs.toDevice.Load() != 0 || fr.toHost.Load() != 0 {
		t.Fatalf("copies in the wrong direction: sender to device %d, receiver to host %d", fs.toDevice.Load(), fr.toHost.Load())
	}
	for _, e := range []*Engine{s, r} {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	fs.checkReleased(t, 8)
	fr.checkReleased(t, 8)
}

// Host and device memory mix in one post, in both directions, and a
// descriptor larger than a staging buffer is staged in pieces; a frame of
// device destinations larger than the receiver's buffer (from a sender
// whose frames are larger) lands in several rounds.
func TestStagedMixedAndLarge(t *testing.T) {
	v := newEnv(t)
	fs, fr := newFakeDevice(), newFakeDevice()
	s := v.engine("s", func(c *Config) { c.Device, c.StageBuffers, c.StageBytes = fs, 2, 256<<10 })
	r := v.engine("r", func(c *Config) { c.Device, c.StageBuffers, c.StageBytes = fr, 2, 16<<10 })
	hsrc, dsrc := v.buf(1<<20, 5, s), v.devBuf(1<<20, 6, s)
	hdst, ddst := v.buf(1<<20, 0, r), v.devBuf(1<<20, 0, r)
	connect(t, s, r)
	ops := []transfer.WriteOp{
		{Src: sub(hsrc, 0, 100_000), Dst: devSub(ddst, 3, 100_000)},          // host -> device
		{Src: devSub(dsrc, 7, 300_001), Dst: sub(hdst, 11, 300_001)},         // device -> host, > one staging buffer
		{Src: devSub(dsrc, 400_000, 5000), Dst: devSub(ddst, 200_000, 5000)}, // device -> device
		{Src: sub(hsrc, 500_000, 1), Dst: sub(hdst, 900_000, 1)},             // host -> host
	}
	op, err := s.PostWrite("r", ops)
	mustDone(t, op, err)
	for i, o := range ops {
		if !bytes.Equal(mem.Unsafe(o.Dst.Addr, o.Dst.Len), mem.Unsafe(o.Src.Addr, o.Src.Len)) {
			t.Fatalf("op %d (%v -> %v) did not land", i, o.Src.Kind, o.Dst.Kind)
		}
	}
	if z := ddst.Bytes()[:3]; !bytes.Equal(z, []byte{0, 0, 0}) || ddst.Bytes()[100_003] != 0 || hdst.Bytes()[10] != 0 || hdst.Bytes()[300_012] != 0 {
		t.Fatal("bytes outside the destinations were written")
	}
}

// A device copy that fails on the sender fails its operation with
// ErrDeviceFault (nothing of that part went out); one that fails on the
// receiver is NACKed with the reason. Either way the connection and the
// engines keep working: the next write lands.
func TestStagedCopyFaults(t *testing.T) {
	for _, side := range []string{"sender", "receiver"} {
		t.Run(side, func(t *testing.T) {
			v, s, r, fs, fr := staged(t)
			src := v.devBuf(64<<10, 21, s)
			dst := v.devBuf(64<<10, 0, r)
			connect(t, s, r)
			if side == "sender" {
				fs.failToHost.Store(3)
			} else {
				fr.failToDevice.Store(3)
			}
			ops := make([]transfer.WriteOp, 8)
			for i := range ops {
				ops[i] = transfer.WriteOp{Src: devSub(src, i*4096, 4096), Dst: devSub(dst, i*4096, 4096)}
			}
			op, err := s.PostWrite("r", ops)
			if err != nil {
				t.Fatal(err)
			}
			ferr := mustFail(t, op, errWant(side))
			if !bytes.Contains([]byte(ferr.Error()), []byte("injected copy fault")) {
				t.Fatalf("error %q does not carry the copy's reason", ferr)
			}
			op, err = s.PostWrite("r", []transfer.WriteOp{{Src: devSub(src, 40960, 4096), Dst: devSub(dst, 40960, 4096)}})
			mustDone(t, op, err)
			if !bytes.Equal(dst.Bytes()[40960:45056], src.Bytes()[40960:45056]) {
				t.Fatal("the write after the fault did not land")
			}
		})
	}
}

func errWant(side string) error {
	if side == "sender" {
		return transfer.ErrDeviceFault
	}
	return errRemote
}

// Close while a staged write is copying waits for the copy to return
// before it frees any staging buffer; the write resolves (never hangs).
func TestStagedCloseWaitsForCopies(t *testing.T) {
	v, s, r, fs, _ := staged(t)
	src := v.devBuf(64<<10, 3, s)
	dst := v.devBuf(64<<10, 0, r)
	connect(t, s, r)
	fs.block, fs.began = make(chan struct{}), make(chan struct{}, 1)
	op, err := s.PostWrite("r", []transfer.WriteOp{{Src: devSub(src, 0, 4096), Dst: devSub(dst, 0, 4096)}})
	if err != nil {
		t.Fatal(err)
	}
	<-fs.began
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	eventually(t, "close reaches the wait for its sessions", func() bool { return s.isClosed() })
	fs.mu.Lock()
	freed := fs.allocs - len(fs.live)
	fs.mu.Unlock()
	if freed != 0 {
		t.Fatalf("%d staging buffers freed while a copy into one was running", freed)
	}
	close(fs.block)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if st, _ := wait(t, op); st != transfer.Done && st != transfer.Failed {
		t.Fatalf("op %v after close", st)
	}
	fs.checkReleased(t, 8)
}

// Without Config.Device CUDA memory is refused; a staging allocation that
// fails fails New, frees what was allocated and closes the device; a bad
// configuration names the field.
func TestStagedConfig(t *testing.T) {
	v := newEnv(t)
	plain := v.engine("plain")
	b := v.buf(4096, 0, nil)
	d := b.Desc()
	d.Kind = transfer.CUDA
	if err := plain.RegisterMemory(d); !errors.Is(err, transfer.ErrUnsupported) {
		t.Fatalf("register cuda without Device: %v, want ErrUnsupported", err)
	}
	if plain.StagedMemoryKinds() != nil || transfer.Stages(plain, transfer.CUDA) {
		t.Fatal("an engine without Device says it stages cuda")
	}
	f := newFakeDevice()
	f.failAlloc = 3
	if _, err := New(Config{Name: "x", Device: f, StageBuffers: 2}); err == nil {
		t.Fatal("New succeeded with a failing staging allocation")
	}
	f.checkReleased(t, 3)
	for _, c := range []Config{{Name: "x", StageBuffers: -1}, {Name: "x", StageBuffers: MaxStageBuffers + 1}, {Name: "x", StageBytes: MaxFramePayload + 1}} {
		if err := c.Validate(); err == nil {
			t.Fatalf("Validate(%+v) passed", c)
		}
	}
}

// A part that finds no incoming staging buffer free waits at most half of
// what is left of its frame's time, then is refused alone (a NACK naming
// the timeout): the frame is still read to its end in time, so its
// connection stays up and the next writes land. (Waiting the whole frame
// timeout left no time to read the frame and tore the connection down,
// failing every part on it.)
func TestStagedInBufferWaitKeepsConnection(t *testing.T) {
	v := newEnv(t)
	fs, fr := newFakeDevice(), newFakeDevice()
	s := v.engine("s", func(c *Config) { c.Device, c.StageBuffers, c.StageBytes, c.Connections = fs, 4, 64<<10, 2 })
	r := v.engine("r", func(c *Config) {
		c.Device, c.StageBuffers, c.StageBytes, c.FrameTimeout = fr, 1, 64<<10, 2*time.Second
	})
	src := v.devBuf(64<<10, 9, s)
	dst := v.devBuf(64<<10, 0, r)
	connect(t, s, r)
	// Both connections up before the contention.
	for i := range 2 {
		op, err := s.PostWrite("r", []transfer.WriteOp{{Src: devSub(src, i*4096, 4096), Dst: devSub(dst, i*4096, 4096)}})
		mustDone(t, op, err)
	}
	block, began := make(chan struct{}), make(chan struct{}, 1)
	fr.mu.Lock()
	fr.blockIn, fr.beganIn = block, began
	fr.mu.Unlock()
	release := sync.OnceFunc(func() { close(block) })
	t.Cleanup(release) // before the engines' Close, which waits for the copy
	held, err := s.PostWrite("r", []transfer.WriteOp{{Src: devSub(src, 8192, 4096), Dst: devSub(dst, 8192, 4096)}})
	if err != nil {
		t.Fatal(err)
	}
	<-began // one connection's reader holds the only incoming buffer
	starved, err := s.PostWrite("r", []transfer.WriteOp{{Src: devSub(src, 12288, 4096), Dst: devSub(dst, 12288, 4096)}})
	if err != nil {
		t.Fatal(err)
	}
	ferr := mustFail(t, starved, errRemote)
	if !strings.Contains(ferr.Error(), "no device staging buffer free") {
		t.Fatalf("starved part failed with %q, want the staging buffer timeout", ferr)
	}
	release()
	mustDone(t, held, nil)
	for i := 4; i < 8; i++ {
		op, err := s.PostWrite("r", []transfer.WriteOp{{Src: devSub(src, i*4096, 4096), Dst: devSub(dst, i*4096, 4096)}})
		mustDone(t, op, err)
	}
	if !bytes.Equal(dst.Bytes()[16384:32768], src.Bytes()[16384:32768]) || !bytes.Equal(dst.Bytes()[:12288], src.Bytes()[:12288]) {
		t.Fatal("writes around the refused part did not land")
	}
	if !bytes.Equal(dst.Bytes()[12288:16384], make([]byte, 4096)) {
		t.Fatal("the refused part landed")
	}
}
