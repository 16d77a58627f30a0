package loopback_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/transfer"
)

// TestPostBlocksByteExact posts a block write between two 2-region pools
// (unaligned bases, gaps between blocks) and checks every byte of the
// destination buffer: the named pieces hold their sources, the rest is
// untouched.
func TestPostBlocksByteExact(t *testing.T) {
	a, _, src, dst, done := pair(t, loopback.Options{})
	S, D := src.Desc(), dst.Desc()
	sp := transfer.Pool{Regions: []uint64{S.Addr + 3, S.Addr + 3 + 16*600}, BlockLen: 512, Stride: 600, Blocks: 16, Kind: transfer.Host}
	dp := transfer.Pool{Regions: []uint64{D.Addr + 5, D.Addr + 5 + 20*520}, BlockLen: 512, Stride: 520, Blocks: 20, Kind: transfer.Host}
	pattern(dst.Bytes(), 9)
	want := bytes.Clone(dst.Bytes())
	w := transfer.BlockWrite{
		Src: transfer.Blocks{Pool: sp, IDs: []uint32{3, 0, 15, 7}},
		Dst: transfer.Blocks{Pool: dp, IDs: []uint32{19, 2, 3, 10}},
		// Pieces 1..6: ids 1-3 of region 0, all of region 1 but the last.
		First: 1, Count: 6,
	}
	for q := w.First; q < w.First+w.Count; q++ {
		s, d := w.Src.Piece(q), w.Dst.Piece(q)
		copy(want[d.Addr-D.Addr:][:d.Len], src.Bytes()[s.Addr-S.Addr:][:s.Len])
	}
	postBlocks(t, a, w, done)
	if !bytes.Equal(dst.Bytes(), want) {
		t.Fatal("destination differs from the model")
	}
}

// postBlocks posts w to peer b, waits for it to be done and releases it.
func postBlocks(t *testing.T, a *loopback.Engine, w transfer.BlockWrite, done <-chan struct{}) {
	t.Helper()
	op, err := a.PostBlocks("b", w)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := await(t, op, done); s != transfer.Done || err != nil {
		t.Fatalf("op %v, %v", s, err)
	}
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestPostBlocksRefused checks that a bad block write is refused at post
// time, before anything moves.
func TestPostBlocksRefused(t *testing.T) {
	a, _, src, dst, _ := pair(t, loopback.Options{})
	S, D := src.Desc(), dst.Desc()
	sp := transfer.Pool{Regions: []uint64{S.Addr}, BlockLen: 512, Stride: 512, Blocks: 16, Kind: transfer.Host}
	dp := transfer.Pool{Regions: []uint64{D.Addr}, BlockLen: 512, Stride: 512, Blocks: 16, Kind: transfer.Host}
	pattern(dst.Bytes(), 9)
	before := bytes.Clone(dst.Bytes())
	past := dp
	past.Blocks = 200 // the span leaves the peer's registered buffer
	wide := dp
	wide.BlockLen, wide.Stride = 1024, 1024
	cases := []struct {
		name string
		w    transfer.BlockWrite
		want error
	}{
		{"dst id out of range", transfer.BlockWrite{Src: transfer.Blocks{Pool: sp, IDs: []uint32{1}}, Dst: transfer.Blocks{Pool: dp, IDs: []uint32{16}}, Count: 1}, transfer.ErrOutOfBounds},
		{"range past the tables", transfer.BlockWrite{Src: transfer.Blocks{Pool: sp, IDs: []uint32{1}}, Dst: transfer.Blocks{Pool: dp, IDs: []uint32{2}}, First: 1, Count: 1}, transfer.ErrOutOfBounds},
		{"block lengths differ", transfer.BlockWrite{Src: transfer.Blocks{Pool: sp, IDs: []uint32{1}}, Dst: transfer.Blocks{Pool: wide, IDs: []uint32{2}}, Count: 1}, transfer.ErrOutOfBounds},
		{"dst span outside the peer's memory", transfer.BlockWrite{Src: transfer.Blocks{Pool: sp, IDs: []uint32{1}}, Dst: transfer.Blocks{Pool: past, IDs: []uint32{2}}, Count: 1}, transfer.ErrOutOfBounds},
		{"unknown peer", transfer.BlockWrite{Src: transfer.Blocks{Pool: sp, IDs: []uint32{1}}, Dst: transfer.Blocks{Pool: dp, IDs: []uint32{2}}, Count: 1}, transfer.ErrUnknownPeer},
	}
	for i, c := range cases {
		peer := "b"
		if i == len(cases)-1 {
			peer = "nobody"
		}
		if _, err := a.PostBlocks(peer, c.w); !errors.Is(err, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if !bytes.Equal(dst.Bytes(), before) {
		t.Fatal("a refused block write changed the destination")
	}
}

// TestPostBlocksReadsItsOwnIDs: a caller that changes its id slices after
// PostBlocks (here just before the copy runs, to an id far past the pool)
// changes nothing: the write copies the ids it checked.
func TestPostBlocksReadsItsOwnIDs(t *testing.T) {
	src, dstIDs := []uint32{1, 2}, []uint32{4, 5}
	a, _, sbuf, dbuf, done := pair(t, loopback.Options{BeforeCopy: func(string, []transfer.WriteOp) error {
		dstIDs[0] = 1 << 30 // the caller's slice, changed mid-transfer
		return nil
	}})
	S, D := sbuf.Desc(), dbuf.Desc()
	sp := transfer.Pool{Regions: []uint64{S.Addr}, BlockLen: 512, Stride: 512, Blocks: 16, Kind: transfer.Host}
	dp := transfer.Pool{Regions: []uint64{D.Addr}, BlockLen: 512, Stride: 512, Blocks: 16, Kind: transfer.Host}
	pattern(sbuf.Bytes(), 4)
	w := transfer.BlockWrite{Src: transfer.Blocks{Pool: sp, IDs: src}, Dst: transfer.Blocks{Pool: dp, IDs: dstIDs}, Count: 2}
	want := bytes.Clone(dbuf.Bytes())
	copy(want[4*512:6*512], sbuf.Bytes()[1*512:3*512])
	postBlocks(t, a, w, done)
	if !bytes.Equal(dbuf.Bytes(), want) {
		t.Fatal("destination differs: the copy read the changed ids")
	}
}
