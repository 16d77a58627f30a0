package driver

import (
	"fmt"

	"github.com/bouncekv/bounce/workload"
)

// FillBuffer writes request i's bytes (spec with Seed+i, as Options.RequestSpec)
// into the i-th spec.Bytes() slice of b, for i below requests: the sources
// a peer pulls (Options.Pull). Device memory is filled through one
// request's host scratch.
func FillBuffer(b Buffer, spec workload.Spec, requests int) error {
	return eachRequest(b, spec, requests, true, func(s workload.Spec, p []byte) error { return s.Fill(p) })
}

// VerifyBuffer checks that the i-th slice of b holds request i's bytes
// (spec with Seed+i at the destination slots) for i below requests, naming
// the first wrong byte. Device memory is copied back one request at a time.
func VerifyBuffer(b Buffer, spec workload.Spec, requests int) error {
	return eachRequest(b, spec, requests, false, func(s workload.Spec, p []byte) error { return s.Verify(p) })
}

// eachRequest runs fn on each request's slice of b (in place for host
// memory, through a scratch copy written back when write is set, else read
// first, for device memory).
func eachRequest(b Buffer, spec workload.Spec, requests int, write bool, fn func(workload.Spec, []byte) error) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	per := spec.Bytes()
	if n := b.Desc().Len; requests < 0 || uint64(requests)*per > n {
		return fmt.Errorf("driver: %d requests x %d bytes exceed the %d-byte buffer", requests, per, n)
	}
	host := HostBytes(b)
	var scratch []byte
	if host == nil {
		scratch = make([]byte, per)
	}
	for i := range requests {
		s := spec
		s.Seed += uint64(i)
		off := uint64(i) * per
		p := scratch
		switch {
		case host != nil:
			p = host[off : off+per]
		case !write:
			if err := b.ReadAt(p, off); err != nil {
				return fmt.Errorf("driver: request %d: read back: %w", i, err)
			}
		}
		if err := fn(s, p); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		if host == nil && write {
			if err := b.WriteAt(p, off); err != nil {
				return fmt.Errorf("driver: request %d: %w", i, err)
			}
		}
	}
	return nil
}

// Buffer returns the Driver's own buffer (a pull's destination).
func (d *Driver) Buffer() Buffer { return d.src }
