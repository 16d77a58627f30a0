//go:build !nixl

package nixl

import (
	"fmt"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// Engine is the NIXL engine. In this build (without the nixl tag) it has no
// implementation: New always fails and every method reports ErrUnsupported.
type Engine struct{ _ struct{} }

var _ transfer.Engine = (*Engine)(nil)
var _ transfer.Notifier = (*Engine)(nil)

// errNoNIXL is the error of every call in a build without the nixl tag.
func errNoNIXL() error {
	return fmt.Errorf("nixl: bounce was built without NIXL support; rebuild with -tags nixl where NIXL is installed (see docs/NIXL.md): %w", transfer.ErrUnsupported)
}

// New reports that this build has no NIXL support: the error wraps
// transfer.ErrUnsupported. The configuration is validated first.
func New(cfg Config) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return nil, errNoNIXL()
}

// Name returns "".
func (e *Engine) Name() string { return "" }

// MaxNotifySize returns 0.
func (e *Engine) MaxNotifySize() int { return 0 }

// RegisterMemory reports ErrUnsupported.
func (e *Engine) RegisterMemory(transfer.Desc) error { return errNoNIXL() }

// DeregisterMemory reports ErrUnsupported.
func (e *Engine) DeregisterMemory(transfer.Desc) error { return errNoNIXL() }

// Metadata reports ErrUnsupported.
func (e *Engine) Metadata() ([]byte, error) { return nil, errNoNIXL() }

// LoadPeer reports ErrUnsupported.
func (e *Engine) LoadPeer([]byte) (string, error) { return "", errNoNIXL() }

// ForgetPeer reports ErrUnsupported.
func (e *Engine) ForgetPeer(string) error { return errNoNIXL() }

// PostWrite reports ErrUnsupported.
func (e *Engine) PostWrite(string, []transfer.WriteOp) (transfer.Op, error) {
	return nil, errNoNIXL()
}

// Notify reports ErrUnsupported.
func (e *Engine) Notify(string, []byte) error { return errNoNIXL() }

// RecvNotification reports ErrUnsupported.
func (e *Engine) RecvNotification(time.Duration) (transfer.Message, error) {
	return transfer.Message{}, errNoNIXL()
}

// Close does nothing.
func (e *Engine) Close() error { return nil }

// Stats returns zero counters.
func (e *Engine) Stats() Stats { return Stats{} }

// Built reports whether this build has the NIXL engine (-tags nixl).
const Built = false
