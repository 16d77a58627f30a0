package cuda

import (
	"fmt"
	"unsafe"
)

// DevicePtr is a CUdeviceptr: an address in the device's (unified) address
// space.
type DevicePtr uint64

// MemAlloc allocates n bytes of device memory.
func (c *Context) MemAlloc(n uint64) (DevicePtr, error) {
	if n == 0 {
		return 0, fmt.Errorf("cuda: cuMemAlloc of 0 bytes")
	}
	var p uint64
	if err := c.call("cuMemAlloc", c.d.fn.memAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n)); err != nil {
		return 0, fmt.Errorf("%w (%d bytes)", err, n)
	}
	return DevicePtr(p), nil
}

// MemAllocManaged allocates n bytes of managed memory
// (cuMemAllocManaged, attached globally): device memory the driver reports
// as such, which this process can also read and write at the same address
// (pages migrate on touch). Free it with MemFree.
func (c *Context) MemAllocManaged(n uint64) (DevicePtr, error) {
	if n == 0 {
		return 0, fmt.Errorf("cuda: cuMemAllocManaged of 0 bytes")
	}
	if c.d.fn.memAllocManaged == 0 {
		return 0, fmt.Errorf("cuda: the driver lacks cuMemAllocManaged: %w", ErrUnavailable)
	}
	const attachGlobal = 1 // CU_MEM_ATTACH_GLOBAL
	var p uint64
	if err := c.call("cuMemAllocManaged", c.d.fn.memAllocManaged, uintptr(unsafe.Pointer(&p)), uintptr(n), attachGlobal); err != nil {
		return 0, fmt.Errorf("%w (%d bytes)", err, n)
	}
	return DevicePtr(p), nil
}

// ManagedBytes returns n bytes of managed memory at p as a byte slice.
func ManagedBytes(p DevicePtr, n uint64) []byte { return unsafe.Slice((*byte)(ptr(uintptr(p))), n) }

// MemFree frees device memory from MemAlloc or MemAllocManaged.
func (c *Context) MemFree(p DevicePtr) error {
	return c.call("cuMemFree", c.d.fn.memFree, uintptr(p))
}

// Flags of HostAlloc (CU_MEMHOSTALLOC_*) and HostRegister
// (CU_MEMHOSTREGISTER_*).
const (
	HostAllocPortable  = 0x1
	HostAllocDeviceMap = 0x2
	HostRegPortable    = 0x1
	HostRegDeviceMap   = 0x2
)

// HostMem is page-locked host memory the device reaches directly: Host is
// its address in this process, Dev the device address of the same bytes.
type HostMem struct {
	Host uintptr
	Dev  DevicePtr
	Len  uint64
}

// Bytes returns the memory as a byte slice.
func (h HostMem) Bytes() []byte { return unsafe.Slice((*byte)(ptr(h.Host)), h.Len) }

// HostAlloc allocates n bytes of pinned host memory, portable across
// contexts and mapped into the device's address space.
func (c *Context) HostAlloc(n uint64) (HostMem, error) {
	if n == 0 {
		return HostMem{}, fmt.Errorf("cuda: cuMemHostAlloc of 0 bytes")
	}
	var p uintptr
	if err := c.call("cuMemHostAlloc", c.d.fn.memHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n), HostAllocPortable|HostAllocDeviceMap); err != nil {
		return HostMem{}, fmt.Errorf("%w (%d bytes)", err, n)
	}
	dp, err := c.HostDevicePointer(p)
	if err != nil {
		_ = c.call("cuMemFreeHost", c.d.fn.memFreeHost, p)
		return HostMem{}, err
	}
	return HostMem{Host: p, Dev: dp, Len: n}, nil
}

// HostFree frees memory from HostAlloc.
func (c *Context) HostFree(h HostMem) error {
	return c.call("cuMemFreeHost", c.d.fn.memFreeHost, h.Host)
}

// HostDevicePointer returns the device address of mapped pinned host
// memory at host address p.
func (c *Context) HostDevicePointer(p uintptr) (DevicePtr, error) {
	var dp uint64
	if err := c.call("cuMemHostGetDevicePointer", c.d.fn.memHostGetDevicePointer, uintptr(unsafe.Pointer(&dp)), p, 0); err != nil {
		return 0, err
	}
	return DevicePtr(dp), nil
}

// HostRegister page-locks caller memory [p, p+n) and maps it for the
// device (portable, device-mapped). The memory must stay mapped until
// HostUnregister.
func (c *Context) HostRegister(p uintptr, n uint64) (HostMem, error) {
	if err := c.call("cuMemHostRegister", c.d.fn.memHostRegister, p, uintptr(n), HostRegPortable|HostRegDeviceMap); err != nil {
		return HostMem{}, fmt.Errorf("%w ([%#x+%d])", err, p, n)
	}
	dp, err := c.HostDevicePointer(p)
	if err != nil {
		_ = c.call("cuMemHostUnregister", c.d.fn.memHostUnregister, p)
		return HostMem{}, err
	}
	return HostMem{Host: p, Dev: dp, Len: n}, nil
}

// HostUnregister undoes HostRegister.
func (c *Context) HostUnregister(p uintptr) error {
	return c.call("cuMemHostUnregister", c.d.fn.memHostUnregister, p)
}

// AddressRange returns the allocation that holds device address p.
func (c *Context) AddressRange(p DevicePtr) (base DevicePtr, size uint64, err error) {
	var b, s uint64
	err = c.call("cuMemGetAddressRange", c.d.fn.memGetAddressRange, uintptr(unsafe.Pointer(&b)), uintptr(unsafe.Pointer(&s)), uintptr(p))
	return DevicePtr(b), s, err
}

// Memory types of PointerMemoryType (CUmemorytype).
const (
	MemoryTypeHost   = 1
	MemoryTypeDevice = 2
)

// PointerMemoryType returns where the memory at p lives (MemoryTypeHost
// for pinned host memory, MemoryTypeDevice for device memory); an address
// the driver does not know is an error.
func (c *Context) PointerMemoryType(p uint64) (int, error) {
	var v uint32
	const attrMemoryType = 2 // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
	if err := c.call("cuPointerGetAttribute", c.d.fn.pointerGetAttribute, uintptr(unsafe.Pointer(&v)), attrMemoryType, uintptr(p)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// CopyHtoD copies len(src) bytes from Go or host memory to device address
// dst and waits for the copy.
func (c *Context) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return c.call("cuMemcpyHtoD", c.d.fn.memcpyHtoD, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)))
}

// CopyDtoH copies len(dst) bytes from device address src and waits.
func (c *Context) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return c.call("cuMemcpyDtoH", c.d.fn.memcpyDtoH, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)))
}

// CopyDtoD copies n bytes between device addresses and waits.
func (c *Context) CopyDtoD(dst, src DevicePtr, n uint64) error {
	return c.call("cuMemcpyDtoD", c.d.fn.memcpyDtoD, uintptr(dst), uintptr(src), uintptr(n))
}

// Memset sets n bytes at device address p to b and waits.
func (c *Context) Memset(p DevicePtr, b byte, n uint64) error {
	return c.call("cuMemsetD8", c.d.fn.memsetD8, uintptr(p), uintptr(b), uintptr(n))
}
