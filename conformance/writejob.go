package conformance

import (
	"fmt"

	"github.com/bouncekv/bounce/transfer"
)

// writeRig is an engine or a writer: one-sided writes of local registered
// memory into memory the peer registered or granted.
type writeRig struct {
	// regSrc registers local memory the writes read; regDst makes memory
	// writable at the peer (registering it there and refreshing the peer).
	regSrc, regDst func(d transfer.Desc) error
	write          func(src, dst transfer.Desc) (transfer.Op, error)
	// multi posts several writes as one op; nil when not available.
	multi func(ops []transfer.WriteOp) (transfer.Op, error)
}

func (w *writeRig) noun() string  { return "write" }
func (w *writeRig) variants() int { return 3 }

// offsets returns the source and destination offsets of a variant:
// aligned, small odd offsets, and random odd offsets within a page.
func writeOffsets(c *rc, variant int) (uint64, uint64) {
	switch variant {
	case 0:
		return 0, 0
	case 1:
		return 1, 3
	default:
		return c.rng.Uint64N(2048)*2 + 1, c.rng.Uint64N(2048)*2 + 1
	}
}

// job prepares a write of n bytes: a fresh source and destination, both
// registered whole, with guard bytes around the written range.
func (w *writeRig) job(c *rc, n uint64, variant int) (*job, error) {
	so, do := writeOffsets(c, variant)
	src, err := c.buf(so + n + 13)
	if err != nil {
		return nil, err
	}
	dst, err := c.buf(do + n + 29)
	if err != nil {
		return nil, err
	}
	c.fill(src)
	c.fill(dst)
	j := &job{srcReg: c.desc(src), dstReg: c.desc(dst)}
	c.step("registering the source and destination of a %d-byte write", n)
	if err := w.regSrc(j.srcReg); err != nil {
		return nil, fmt.Errorf("registering source %v: %w", j.srcReg, err)
	}
	if err := w.regDst(j.dstReg); err != nil {
		return nil, fmt.Errorf("registering destination %v: %w", j.dstReg, err)
	}
	j.src, j.dst = c.desc(src[so:so+n]), c.desc(dst[do:do+n])
	j.what = fmt.Sprintf("write of %d bytes (src+%d → dst+%d)", n, so, do)
	j.post = func() (transfer.Op, error) { return w.write(j.src, j.dst) }
	j.watch("source", src, nil)
	j.watch("destination", dst[do:do+n], src[so:so+n])
	if do > 0 {
		j.watch("guard before the destination:", dst[:do], nil)
	}
	j.watch("guard after the destination:", dst[do+n:], nil)
	return j, nil
}

// badJobs prepares writes the implementation must refuse. Each case has
// buffers of its own — a source and a destination registered only up to
// regLen, and a buffer not registered at all — so a write that lands is
// blamed on the case that made it.
func (w *writeRig) badJobs(c *rc) ([]*job, error) {
	const regLen, tail, n = 4096, 64, 64
	bounds := []error{transfer.ErrOutOfBounds, transfer.ErrNotRegistered}
	type bufs struct{ src, dst, loose []byte }
	alloc := func() (bufs, error) {
		var b bufs
		var err error
		if b.src, err = c.buf(regLen + tail); err != nil {
			return b, err
		}
		if b.dst, err = c.buf(regLen + tail); err != nil {
			return b, err
		}
		if b.loose, err = c.buf(regLen); err != nil {
			return b, err
		}
		c.fill(b.src)
		c.fill(b.dst)
		c.fill(b.loose)
		if err := w.regSrc(c.desc(b.src[:regLen])); err != nil {
			return b, fmt.Errorf("registering source: %w", err)
		}
		if err := w.regDst(c.desc(b.dst[:regLen])); err != nil {
			return b, fmt.Errorf("registering destination: %w", err)
		}
		return b, nil
	}
	cases := []struct {
		what      string
		write     func(b bufs) (src, dst transfer.Desc)
		sentinels []error
	}{
		{"write to unregistered destination memory", func(b bufs) (transfer.Desc, transfer.Desc) {
			return c.desc(b.src[:n]), c.desc(b.loose[:n])
		}, bounds},
		{"write straddling the end of the registered destination", func(b bufs) (transfer.Desc, transfer.Desc) {
			return c.desc(b.src[:n]), c.desc(b.dst[regLen-n/2 : regLen+n/2])
		}, bounds},
		{"write from unregistered source memory", func(b bufs) (transfer.Desc, transfer.Desc) {
			return c.desc(b.loose[:n]), c.desc(b.dst[:n])
		}, bounds},
		{"write from a source straddling the end of registered memory", func(b bufs) (transfer.Desc, transfer.Desc) {
			return c.desc(b.src[regLen-n/2 : regLen+n/2]), c.desc(b.dst[:n])
		}, bounds},
		{"write to a destination that wraps the address space", func(b bufs) (transfer.Desc, transfer.Desc) {
			return c.desc(b.src[:n]), transfer.Desc{Addr: ^uint64(0) - n/2, Len: n, Kind: c.memory.Kind, Device: c.memory.Device}
		}, bounds},
		{"write with Src.Len != Dst.Len", func(b bufs) (transfer.Desc, transfer.Desc) {
			return c.desc(b.src[:n]), c.desc(b.dst[:n/2])
		}, nil},
	}
	watch := func(j *job, b bufs) {
		j.watch("source buffer", b.src, nil)
		j.watch("destination buffer", b.dst, nil)
		j.watch("unregistered buffer", b.loose, nil)
	}
	var out []*job
	for _, k := range cases {
		b, err := alloc()
		if err != nil {
			return nil, err
		}
		src, dst := k.write(b)
		j := &job{what: k.what, src: src, dst: dst, sentinels: k.sentinels}
		j.post = func() (transfer.Op, error) { return w.write(j.src, j.dst) }
		watch(j, b)
		out = append(out, j)
	}
	if w.multi != nil {
		b, err := alloc()
		if err != nil {
			return nil, err
		}
		ops := []transfer.WriteOp{
			{Src: c.desc(b.src[:n]), Dst: c.desc(b.dst[:n])},
			{Src: c.desc(b.src[n : 2*n]), Dst: c.desc(b.loose[:n])},
		}
		j := &job{
			what:      "post of two writes whose second targets unregistered memory",
			post:      func() (transfer.Op, error) { return w.multi(ops) },
			sentinels: bounds,
			optional:  true,
		}
		watch(j, b)
		out = append(out, j)
	}
	return out, nil
}
