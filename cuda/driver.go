// Package cuda is the part of the CUDA driver API bounce uses, called
// through github.com/ebitengine/purego: no cgo and no CUDA toolkit are
// needed to build it, and CGO_ENABLED=0 builds work. libcuda.so.1 is opened
// on first use (Lib.Open); where it is absent every call reports an error
// wrapping ErrUnavailable ("cuda unavailable: <reason>").
//
// A Driver owns the library handle and the resolved symbols (the _v2
// entry points); a Context is a retained primary context of one device.
// Every call that needs a current context locks the calling goroutine to
// its OS thread and makes the context current for the duration of the call.
// Hot paths (kernel launch, async copies, event record and query) go through
// purego.SyscallN, never reflection.
package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ErrUnavailable means the CUDA driver could not be loaded or initialised:
// no libcuda.so.1, no device, or a driver too old for a symbol bounce needs.
var ErrUnavailable = errors.New("cuda unavailable")

// LibName is the driver library Lib opens when its Path is empty.
const LibName = "libcuda.so.1"

// Result is a CUresult: a driver call's status code.
type Result int32

// Codes bounce tests for.
const (
	Success  Result = 0
	NotReady Result = 600 // CUDA_ERROR_NOT_READY: the event or stream has work pending
)

// Error is a failed driver call: the call's name, its code, and the
// driver's name and text for the code.
type Error struct {
	Call string
	Code Result
	Name string
	Text string
}

func (e *Error) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d): %s", e.Call, e.Name, e.Code, e.Text)
}

// Lib opens the driver lazily: the first Open loads it and later calls
// return the same Driver (or the same error). The zero value opens LibName.
// It is safe for concurrent use.
type Lib struct {
	// Path is the library to open; empty means LibName.
	Path string

	once sync.Once
	drv  *Driver
	err  error
}

// Open loads and initialises the driver on first use.
func (l *Lib) Open() (*Driver, error) {
	l.once.Do(func() { l.drv, l.err = Open(l.Path) })
	return l.drv, l.err
}

// Driver is a loaded, initialised CUDA driver. It is safe for concurrent
// use and is never unloaded (the driver cannot be safely dlclosed while
// contexts may exist).
type Driver struct {
	lib uintptr
	fn  symbols
}

type symbols struct {
	init, getErrorName, getErrorString, driverGetVersion                   uintptr
	deviceGetCount, deviceGet, deviceGetName, deviceGetAttribute           uintptr
	deviceTotalMem, deviceCanAccessPeer                                    uintptr
	primaryCtxRetain, primaryCtxRelease, ctxSetCurrent, ctxSynchronize     uintptr
	ctxEnablePeerAccess                                                    uintptr
	streamCreate, streamDestroy, streamSynchronize, streamQuery            uintptr
	eventCreate, eventDestroy, eventRecord, eventQuery, eventSynchronize   uintptr
	eventElapsedTime                                                       uintptr
	memAlloc, memFree, memHostAlloc, memFreeHost, memHostGetDevicePointer  uintptr
	memHostRegister, memHostUnregister, memsetD8, memsetD8Async            uintptr
	memcpyHtoD, memcpyDtoH, memcpyDtoD, memcpyHtoDAsync, memcpyDtoHAsync   uintptr
	memcpyDtoDAsync, memcpyPeerAsync, memcpyBatchAsync, memGetAddressRange uintptr
	memcpyAsync, memAllocManaged                                           uintptr
	ipcGetMemHandle, ipcOpenMemHandle, ipcCloseMemHandle                   uintptr // optional (ipc.go)
	moduleLoadDataEx, moduleUnload, moduleGetFunction, launchKernel        uintptr
	pointerGetAttribute, occupancy                                         uintptr
}

// Open loads the driver library at path (LibName when empty), resolves the
// symbols bounce uses and calls cuInit. Errors wrap ErrUnavailable.
func Open(path string) (*Driver, error) {
	if path == "" {
		path = LibName
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("%w: dlopen %s: %v", ErrUnavailable, path, err)
	}
	d := &Driver{lib: h}
	f := &d.fn
	required := []struct {
		p    *uintptr
		name string
	}{
		{&f.init, "cuInit"}, {&f.getErrorName, "cuGetErrorName"}, {&f.getErrorString, "cuGetErrorString"},
		{&f.driverGetVersion, "cuDriverGetVersion"},
		{&f.deviceGetCount, "cuDeviceGetCount"}, {&f.deviceGet, "cuDeviceGet"}, {&f.deviceGetName, "cuDeviceGetName"},
		{&f.deviceGetAttribute, "cuDeviceGetAttribute"}, {&f.deviceTotalMem, "cuDeviceTotalMem_v2"},
		{&f.deviceCanAccessPeer, "cuDeviceCanAccessPeer"},
		{&f.primaryCtxRetain, "cuDevicePrimaryCtxRetain"}, {&f.primaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
		{&f.ctxSetCurrent, "cuCtxSetCurrent"}, {&f.ctxSynchronize, "cuCtxSynchronize"},
		{&f.ctxEnablePeerAccess, "cuCtxEnablePeerAccess"},
		{&f.streamCreate, "cuStreamCreate"}, {&f.streamDestroy, "cuStreamDestroy_v2"},
		{&f.streamSynchronize, "cuStreamSynchronize"}, {&f.streamQuery, "cuStreamQuery"},
		{&f.eventCreate, "cuEventCreate"}, {&f.eventDestroy, "cuEventDestroy_v2"}, {&f.eventRecord, "cuEventRecord"},
		{&f.eventQuery, "cuEventQuery"}, {&f.eventSynchronize, "cuEventSynchronize"},
		{&f.eventElapsedTime, "cuEventElapsedTime"},
		{&f.memAlloc, "cuMemAlloc_v2"}, {&f.memFree, "cuMemFree_v2"}, {&f.memHostAlloc, "cuMemHostAlloc"},
		{&f.memFreeHost, "cuMemFreeHost"}, {&f.memHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"},
		{&f.memHostRegister, "cuMemHostRegister_v2"}, {&f.memHostUnregister, "cuMemHostUnregister"},
		{&f.memsetD8, "cuMemsetD8_v2"}, {&f.memsetD8Async, "cuMemsetD8Async"},
		{&f.memcpyHtoD, "cuMemcpyHtoD_v2"}, {&f.memcpyDtoH, "cuMemcpyDtoH_v2"}, {&f.memcpyDtoD, "cuMemcpyDtoD_v2"},
		{&f.memcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"}, {&f.memcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"},
		{&f.memcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"}, {&f.memcpyAsync, "cuMemcpyAsync"}, {&f.memcpyPeerAsync, "cuMemcpyPeerAsync"},
		{&f.memGetAddressRange, "cuMemGetAddressRange_v2"},
		{&f.moduleLoadDataEx, "cuModuleLoadDataEx"}, {&f.moduleUnload, "cuModuleUnload"},
		{&f.moduleGetFunction, "cuModuleGetFunction"}, {&f.launchKernel, "cuLaunchKernel"},
		{&f.pointerGetAttribute, "cuPointerGetAttribute"},
		{&f.occupancy, "cuOccupancyMaxActiveBlocksPerMultiprocessor"},
	}
	for _, s := range required {
		p, err := purego.Dlsym(h, s.name)
		if err != nil || p == 0 {
			return nil, fmt.Errorf("%w: %s lacks %s: %v", ErrUnavailable, path, s.name, err)
		}
		*s.p = p
	}
	// Optional: the batched copy of CUDA 12.8 and later (its 12.8 ABI).
	if p, err := purego.Dlsym(h, "cuMemcpyBatchAsync"); err == nil {
		f.memcpyBatchAsync = p
	}
	d.openIPC()
	// Optional: managed memory (what conformance runs its device-memory
	// rules on, as the host can read it too).
	if p, err := purego.Dlsym(h, "cuMemAllocManaged"); err == nil {
		f.memAllocManaged = p
	}
	if err := d.check("cuInit", sys(f.init, 0)); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return d, nil
}

// sys calls a C function. Pointer arguments converted to uintptr in the
// call expression stay valid for the call (go:uintptrescapes, as for
// purego.SyscallN).
//
//go:uintptrescapes
func sys(fn uintptr, args ...uintptr) Result {
	r, _, _ := purego.SyscallN(fn, args...)
	return Result(int32(r))
}

// check turns a result into an error naming the call.
func (d *Driver) check(call string, r Result) error {
	if r == Success {
		return nil
	}
	return &Error{Call: call, Code: r, Name: d.cstr(d.fn.getErrorName, r), Text: d.cstr(d.fn.getErrorString, r)}
}

func (d *Driver) cstr(fn uintptr, r Result) string {
	var p uintptr
	if sys(fn, uintptr(r), uintptr(unsafe.Pointer(&p))) != Success || p == 0 {
		return "unknown error"
	}
	return goString(p)
}

// goString copies a NUL-terminated C string.
func goString(p uintptr) string {
	var b []byte
	for i := uintptr(0); i < 4096; i++ {
		c := *(*byte)(ptr(p + i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// ptr turns a C address into a pointer without the conversion go vet
// flags: the memory is C memory, never moved by the Go runtime.
func ptr(a uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&a)) }

// Version returns the driver's CUDA version (1000 × major + 10 × minor).
func (d *Driver) Version() (int, error) {
	var v int32
	if err := d.check("cuDriverGetVersion", sys(d.fn.driverGetVersion, uintptr(unsafe.Pointer(&v)))); err != nil {
		return 0, err
	}
	return int(v), nil
}

// DeviceCount returns the number of CUDA devices.
func (d *Driver) DeviceCount() (int, error) {
	var n int32
	if err := d.check("cuDeviceGetCount", sys(d.fn.deviceGetCount, uintptr(unsafe.Pointer(&n)))); err != nil {
		return 0, err
	}
	return int(n), nil
}

// HasBatchCopy reports whether the driver exports cuMemcpyBatchAsync.
func (d *Driver) HasBatchCopy() bool { return d.fn.memcpyBatchAsync != 0 }

// Primary retains the primary context of device ordinal dev. Release
// gives it back.
func (d *Driver) Primary(dev int) (*Context, error) {
	n, err := d.DeviceCount()
	if err != nil {
		return nil, err
	}
	if dev < 0 || dev >= n {
		return nil, fmt.Errorf("cuda: device %d: have %d devices: %w", dev, n, ErrUnavailable)
	}
	var h int32
	if err := d.check("cuDeviceGet", sys(d.fn.deviceGet, uintptr(unsafe.Pointer(&h)), uintptr(dev))); err != nil {
		return nil, err
	}
	var c uintptr
	if err := d.check("cuDevicePrimaryCtxRetain", sys(d.fn.primaryCtxRetain, uintptr(unsafe.Pointer(&c)), uintptr(h))); err != nil {
		return nil, err
	}
	return &Context{d: d, dev: dev, h: h, c: c}, nil
}

// Context is a retained primary context of one device. Its methods are
// safe for concurrent use; each makes the context current on a locked OS
// thread for the duration of the call.
type Context struct {
	d   *Driver
	dev int
	h   int32 // CUdevice
	c   uintptr

	mu       sync.Mutex
	released bool
}

// Driver returns the driver the context belongs to.
func (c *Context) Driver() *Driver { return c.d }

// Device returns the device ordinal.
func (c *Context) Device() int { return c.dev }

// Release gives the primary context back. It is idempotent.
func (c *Context) Release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return nil
	}
	c.released = true
	return c.d.check("cuDevicePrimaryCtxRelease", sys(c.d.fn.primaryCtxRelease, uintptr(c.h)))
}

// call makes the context current on this OS thread and calls fn.
//
//go:uintptrescapes
func (c *Context) call(name string, fn uintptr, args ...uintptr) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := sys(c.d.fn.ctxSetCurrent, c.c); r != Success {
		return c.d.check("cuCtxSetCurrent", r)
	}
	r, _, _ := purego.SyscallN(fn, args...)
	return c.d.check(name, Result(int32(r)))
}

// callResult is call returning the raw result (for queries where
// NotReady is no error).
//
//go:uintptrescapes
func (c *Context) callResult(fn uintptr, args ...uintptr) Result {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := sys(c.d.fn.ctxSetCurrent, c.c); r != Success {
		return r
	}
	r, _, _ := purego.SyscallN(fn, args...)
	return Result(int32(r))
}

// Name returns the device's name.
func (c *Context) Name() (string, error) {
	buf := make([]byte, 256)
	if err := c.d.check("cuDeviceGetName", sys(c.d.fn.deviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(c.h))); err != nil {
		return "", err
	}
	for i, b := range buf {
		if b == 0 {
			return string(buf[:i]), nil
		}
	}
	return string(buf), nil
}

// Device attributes bounce reads (CUdevice_attribute).
const (
	AttrMultiprocessorCount     = 16
	AttrUnifiedAddressing       = 41
	AttrCanMapHostMemory        = 19
	AttrMaxThreadsPerMultiproc  = 39
	AttrComputeCapabilityMajor  = 75
	AttrComputeCapabilityMinor  = 76
	AttrPageableMemoryAccessAll = 88
)

// Attribute returns one device attribute.
func (c *Context) Attribute(attr int) (int, error) {
	var v int32
	if err := c.d.check("cuDeviceGetAttribute", sys(c.d.fn.deviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(c.h))); err != nil {
		return 0, err
	}
	return int(v), nil
}

// TotalMem returns the device's memory size.
func (c *Context) TotalMem() (uint64, error) {
	var v uint64
	if err := c.d.check("cuDeviceTotalMem", sys(c.d.fn.deviceTotalMem, uintptr(unsafe.Pointer(&v)), uintptr(c.h))); err != nil {
		return 0, err
	}
	return v, nil
}

// CanAccessPeer reports whether this device can access peer's memory.
func (c *Context) CanAccessPeer(peer *Context) (bool, error) {
	var v int32
	if err := c.d.check("cuDeviceCanAccessPeer", sys(c.d.fn.deviceCanAccessPeer, uintptr(unsafe.Pointer(&v)), uintptr(c.h), uintptr(peer.h))); err != nil {
		return false, err
	}
	return v != 0, nil
}

// EnablePeerAccess lets this context access peer's memory; access already
// enabled is no error.
func (c *Context) EnablePeerAccess(peer *Context) error {
	err := c.call("cuCtxEnablePeerAccess", c.d.fn.ctxEnablePeerAccess, peer.c, 0)
	var e *Error
	if errors.As(err, &e) && e.Code == 704 { // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
		return nil
	}
	return err
}

// Synchronize waits for every stream of the context. Never call it on a
// reactor goroutine: it blocks.
func (c *Context) Synchronize() error {
	return c.call("cuCtxSynchronize", c.d.fn.ctxSynchronize)
}
