package conformance

import (
	"fmt"

	"github.com/bouncekv/bounce/mem"
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
	j := &job{srcReg: mem.DescOf(src), dstReg: mem.DescOf(dst)}
	c.step("registering the source and destination of a %d-byte write", n)
	if err := w.regSrc(j.srcReg); err != nil {
		return nil, fmt.Errorf("registering source %v: %w", j.srcReg, err)
	}
	if err := w.regDst(j.dstReg); err != nil {
		return nil, fmt.Errorf("registering destination %v: %w", j.dstReg, err)
	}
	j.src, j.dst = mem.DescOf(src[so:so+n]), mem.DescOf(dst[do:do+n])
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

// badJobs prepares writes the implementation must refuse: the source and
// destination buffers are registered only up to regLen, and a third buffer
// is not registered at all.
func (w *writeRig) badJobs(c *rc) ([]*job, error) {
	const regLen, tail, n = 4096, 64, 64
	src, err := c.buf(regLen + tail)
	if err != nil {
		return nil, err
	}
	dst, err := c.buf(regLen + tail)
	if err != nil {
		return nil, err
	}
	loose, err := c.buf(regLen)
	if err != nil {
		return nil, err
	}
	c.fill(src)
	c.fill(dst)
	c.fill(loose)
	if err := w.regSrc(mem.DescOf(src[:regLen])); err != nil {
		return nil, fmt.Errorf("registering source: %w", err)
	}
	if err := w.regDst(mem.DescOf(dst[:regLen])); err != nil {
		return nil, fmt.Errorf("registering destination: %w", err)
	}
	bounds := []error{transfer.ErrOutOfBounds, transfer.ErrNotRegistered}
	cases := []struct {
		what      string
		src, dst  transfer.Desc
		sentinels []error
	}{
		{"write to unregistered destination memory", mem.DescOf(src[:n]), mem.DescOf(loose[:n]), bounds},
		{"write straddling the end of the registered destination", mem.DescOf(src[:n]), mem.DescOf(dst[regLen-n/2 : regLen+n/2]), bounds},
		{"write from unregistered source memory", mem.DescOf(loose[:n]), mem.DescOf(dst[:n]), bounds},
		{"write from a source straddling the end of registered memory", mem.DescOf(src[regLen-n/2 : regLen+n/2]), mem.DescOf(dst[:n]), bounds},
		{"write to a destination that wraps the address space", mem.DescOf(src[:n]), transfer.Desc{Addr: ^uint64(0) - n/2, Len: n, Kind: transfer.Host}, bounds},
		{"write with Src.Len != Dst.Len", mem.DescOf(src[:n]), mem.DescOf(dst[:n/2]), nil},
	}
	var out []*job
	for _, k := range cases {
		j := &job{what: k.what, src: k.src, dst: k.dst, sentinels: k.sentinels}
		j.post = func() (transfer.Op, error) { return w.write(j.src, j.dst) }
		out = append(out, j)
	}
	if w.multi != nil {
		ops := []transfer.WriteOp{
			{Src: mem.DescOf(src[:n]), Dst: mem.DescOf(dst[:n])},
			{Src: mem.DescOf(src[n : 2*n]), Dst: mem.DescOf(loose[:n])},
		}
		out = append(out, &job{
			what:      "post of two writes whose second targets unregistered memory",
			post:      func() (transfer.Op, error) { return w.multi(ops) },
			sentinels: bounds,
			optional:  true,
		})
	}
	for _, j := range out {
		j.watch("source buffer", src, nil)
		j.watch("destination buffer", dst, nil)
		j.watch("unregistered buffer", loose, nil)
	}
	return out, nil
}
