package cuda

import (
	"fmt"
	"strings"
	"unsafe"
)

// JIT options of cuModuleLoadDataEx (CUjit_option). The option array holds
// 4-byte enums; the value array holds pointer-sized values.
const (
	jitErrorLogBuffer          = 5
	jitErrorLogBufferSizeBytes = 6
)

// Module is a loaded module (PTX JIT-compiled for the device).
type Module struct {
	c *Context
	h uintptr
}

// LoadPTX JIT-compiles and loads a PTX image. A JIT failure carries the
// compiler's log.
func (c *Context) LoadPTX(ptx []byte) (*Module, error) {
	img := make([]byte, len(ptx)+1) // NUL-terminated
	copy(img, ptx)
	const logSize = 8 << 10
	logBuf := make([]byte, logSize)
	opts := []int32{jitErrorLogBuffer, jitErrorLogBufferSizeBytes}
	vals := []uintptr{uintptr(unsafe.Pointer(&logBuf[0])), logSize}
	var h uintptr
	err := c.call("cuModuleLoadDataEx", c.d.fn.moduleLoadDataEx,
		uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&img[0])), uintptr(len(opts)),
		uintptr(unsafe.Pointer(&opts[0])), uintptr(unsafe.Pointer(&vals[0])))
	if err != nil {
		log := string(logBuf)
		if i := strings.IndexByte(log, 0); i >= 0 {
			log = log[:i]
		}
		if log != "" {
			return nil, fmt.Errorf("%w: JIT log: %s", err, strings.TrimSpace(log))
		}
		return nil, err
	}
	return &Module{c: c, h: h}, nil
}

// Function returns the kernel named name.
func (m *Module) Function(name string) (*Function, error) {
	cname := append([]byte(name), 0)
	var f uintptr
	if err := m.c.call("cuModuleGetFunction", m.c.d.fn.moduleGetFunction, uintptr(unsafe.Pointer(&f)), m.h, uintptr(unsafe.Pointer(&cname[0]))); err != nil {
		return nil, fmt.Errorf("%w (kernel %q)", err, name)
	}
	return &Function{c: m.c, h: f, name: name}, nil
}

// Unload unloads the module.
func (m *Module) Unload() error {
	return m.c.call("cuModuleUnload", m.c.d.fn.moduleUnload, m.h)
}

// Function is a kernel of a loaded module.
type Function struct {
	c    *Context
	h    uintptr
	name string
}

// Name returns the kernel's name.
func (f *Function) Name() string { return f.name }

// ActiveBlocks returns how many blocks of blockSize threads (and no
// dynamic shared memory) one multiprocessor holds at once.
func (f *Function) ActiveBlocks(blockSize int) (int, error) {
	var n int32
	if err := f.c.call("cuOccupancyMaxActiveBlocksPerMultiprocessor", f.c.d.fn.occupancy, uintptr(unsafe.Pointer(&n)), f.h, uintptr(blockSize), 0); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// Launch queues the kernel on s with the parameters of args (which stay
// in C memory: the driver reads them during the call, so args may be
// rewritten once Launch returns).
func (f *Function) Launch(s *Stream, grid, block Dim3, sharedMem uint32, args *Args) error {
	return f.c.call("cuLaunchKernel", f.c.d.fn.launchKernel, f.h,
		uintptr(grid.X), uintptr(grid.Y), uintptr(grid.Z),
		uintptr(block.X), uintptr(block.Y), uintptr(block.Z),
		uintptr(sharedMem), s.h, args.params, 0)
}

// Args holds up to n 8-byte kernel parameters and the pointer array
// cuLaunchKernel takes, in pinned host memory (never Go memory). Every
// parameter slot is 8 bytes: 64-bit integers and pointers as they are,
// 32-bit ones in the low half (the kernel ABI is little-endian).
type Args struct {
	c      *Context
	mem    HostMem
	n      int
	params uintptr // void*[n], each pointing at its slot
}

// NewArgs allocates room for n parameters.
func (c *Context) NewArgs(n int) (*Args, error) {
	if n <= 0 || n > 64 {
		return nil, fmt.Errorf("cuda: %d kernel parameters outside [1, 64]", n)
	}
	m, err := c.HostAlloc(uint64(16 * n))
	if err != nil {
		return nil, err
	}
	return newArgsAt(c, m, n), nil
}

// newArgsAt lays the block out in m: n 8-byte slots, then n pointers.
func newArgsAt(c *Context, m HostMem, n int) *Args {
	a := &Args{c: c, mem: m, n: n, params: m.Host + uintptr(8*n)}
	for i := range n {
		*(*uintptr)(ptr(a.params + uintptr(8*i))) = m.Host + uintptr(8*i)
	}
	return a
}

// SetU64 sets parameter i to a 64-bit value (a pointer or a size_t).
func (a *Args) SetU64(i int, v uint64) {
	if i < 0 || i >= a.n {
		panic(fmt.Sprintf("cuda: kernel parameter %d outside [0, %d)", i, a.n))
	}
	*(*uint64)(ptr(a.mem.Host + uintptr(8*i))) = v
}

// SetU32 sets parameter i to a 32-bit value.
func (a *Args) SetU32(i int, v uint32) { a.SetU64(i, uint64(v)) }

// Slot returns parameter i's current 8 bytes (tests check the packing).
func (a *Args) Slot(i int) uint64 { return *(*uint64)(ptr(a.mem.Host + uintptr(8*i))) }

// Pointer returns the address cuLaunchKernel receives for parameter i.
func (a *Args) Pointer(i int) uintptr { return *(*uintptr)(ptr(a.params + uintptr(8*i))) }

// Free releases the parameter memory.
func (a *Args) Free() error { return a.c.HostFree(a.mem) }
