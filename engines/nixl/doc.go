// Package nixl is a transfer.Engine and transfer.Notifier over NVIDIA's NIXL
// (ai-dynamo/nixl) with its UCX backend, reached through cgo and a small C++
// shim over NIXL's public header nixl.h.
//
// The real engine is built only with the build tag nixl (go build -tags nixl)
// where NIXL is installed; see docs/NIXL.md for the include, library and
// plugin paths it needs. Without the tag the package is pure Go and New
// returns an error wrapping transfer.ErrUnsupported, so code that imports it
// builds everywhere.
//
// Metadata is NIXL's own agent metadata (getLocalMD) wrapped in a small
// versioned envelope that also carries the agent name and the registered
// ranges, so PostWrite checks every destination against what the peer
// advertised before NIXL sees it. Writes are NIXL_WRITE transfer requests
// without a notification; Op.Poll is getXferStatus and Op.Release is
// releaseXferReq. Notify is genNotif and received notifications come from
// getNotifs, polled by a background goroutine that also progresses the UCX
// worker (NIXL's progress thread is off unless Config.ProgressThread is set).
//
// A NIXL agent is not safe for concurrent use (NIXL 0.1.1 has no thread-safe
// mode), so every NIXL call of an Engine is made under one mutex.
package nixl
