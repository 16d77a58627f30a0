package cuda

import (
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/ebitengine/purego"
)

// IPCHandleSize is the size of a CUipcMemHandle.
const IPCHandleSize = 64

// IPCHandle is a CUipcMemHandle: an opaque name for a cuMemAlloc
// allocation that another process on the host opens with OpenIPC.
type IPCHandle [IPCHandleSize]byte

// String is the handle in hex.
func (h IPCHandle) String() string { return hex.EncodeToString(h[:]) }

// ErrNoIPC means the driver does not export the CUDA IPC calls (or this
// platform's calling convention for them is not implemented).
var ErrNoIPC = errors.New("cuda: CUDA IPC unavailable")

// openIPC resolves the IPC symbols; they are optional, so a driver
// without them still serves everything else.
func (d *Driver) openIPC() {
	f := &d.fn
	for _, s := range []struct {
		p     *uintptr
		names []string
	}{
		{&f.ipcGetMemHandle, []string{"cuIpcGetMemHandle"}},
		{&f.ipcOpenMemHandle, []string{"cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"}},
		{&f.ipcCloseMemHandle, []string{"cuIpcCloseMemHandle"}},
	} {
		for _, n := range s.names {
			if p, err := purego.Dlsym(d.lib, n); err == nil && p != 0 {
				*s.p = p
				break
			}
		}
	}
}

// HasIPC reports whether the driver exports the CUDA IPC calls and this
// platform passes their handle argument (amd64, arm64).
func (d *Driver) HasIPC() bool {
	ok := d.fn.ipcGetMemHandle != 0 && d.fn.ipcOpenMemHandle != 0 && d.fn.ipcCloseMemHandle != 0
	return ok && (runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64")
}

// IPCHandle exports the allocation holding device address p (which must be
// a cuMemAlloc allocation's base; see AddressRange) for other processes.
func (c *Context) IPCHandle(p DevicePtr) (IPCHandle, error) {
	var h IPCHandle
	if !c.d.HasIPC() {
		return h, ErrNoIPC
	}
	err := c.call("cuIpcGetMemHandle", c.d.fn.ipcGetMemHandle, uintptr(unsafe.Pointer(&h[0])), uintptr(p))
	return h, err
}

// ipcLazyEnablePeerAccess is CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.
const ipcLazyEnablePeerAccess = 1

// OpenIPC maps another process's allocation into this context and returns
// its base address here. CloseIPC unmaps it. Opening a handle this process
// exported is an error (the driver refuses it).
func (c *Context) OpenIPC(h IPCHandle) (DevicePtr, error) {
	if !c.d.HasIPC() {
		return 0, ErrNoIPC
	}
	var p uint64
	// The handle is a 64-byte struct passed by value: on amd64 (System V)
	// it travels on the stack and takes no register, so the flags are the
	// second register argument and the handle's eight words follow the six
	// register slots; on arm64 (AAPCS64) a composite over 16 bytes is
	// passed by reference to a copy.
	w := (*[8]uintptr)(unsafe.Pointer(&h))
	var err error
	switch runtime.GOARCH {
	case "amd64":
		err = c.call("cuIpcOpenMemHandle", c.d.fn.ipcOpenMemHandle, uintptr(unsafe.Pointer(&p)), ipcLazyEnablePeerAccess, 0, 0, 0, 0,
			w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7])
	default:
		cp := h
		err = c.call("cuIpcOpenMemHandle", c.d.fn.ipcOpenMemHandle, uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(&cp[0])), ipcLazyEnablePeerAccess)
		runtime.KeepAlive(&cp)
	}
	if err != nil {
		return 0, fmt.Errorf("%w (handle %.16s…)", err, h)
	}
	return DevicePtr(p), nil
}

// CloseIPC unmaps an allocation OpenIPC mapped.
func (c *Context) CloseIPC(p DevicePtr) error {
	if !c.d.HasIPC() {
		return ErrNoIPC
	}
	return c.call("cuIpcCloseMemHandle", c.d.fn.ipcCloseMemHandle, uintptr(p))
}
