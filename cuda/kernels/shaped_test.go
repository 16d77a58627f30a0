package kernels_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/cuda/kernels"
	"github.com/bouncekv/bounce/transfer"
)

func TestEncodeSegments(t *testing.T) {
	segs := []transfer.Segment{{Block: 1, Off: 4096, Len: 256}, {Block: 0, Off: 16, Len: 100}, {Block: 3, Off: 0, Len: 7}}
	b := kernels.EncodeSegments([]byte{9}, segs)
	if len(b) != 1+kernels.SegmentSize*len(segs) || b[0] != 9 {
		t.Fatalf("encoded %d bytes (first %d)", len(b), b[0])
	}
	var roff uint32
	for i, s := range segs {
		e := b[1+i*kernels.SegmentSize:]
		got := [4]uint32{binary.LittleEndian.Uint32(e), binary.LittleEndian.Uint32(e[4:]), binary.LittleEndian.Uint32(e[8:]), binary.LittleEndian.Uint32(e[12:])}
		if want := [4]uint32{s.Block, s.Off, s.Len, roff}; got != want {
			t.Errorf("segment %d encoded %v, want %v", i, got, want)
		}
		roff += s.Len
	}
}

func TestUniformLen(t *testing.T) {
	for _, cs := range []struct {
		segs []transfer.Segment
		want uint64
	}{
		{nil, 0},
		{[]transfer.Segment{{Len: 256}}, 256},
		{[]transfer.Segment{{Len: 256}, {Off: 512, Len: 256}}, 256},
		{[]transfer.Segment{{Len: 256}, {Off: 512, Len: 255}}, 0},
	} {
		if got := kernels.UniformLen(cs.segs); got != cs.want {
			t.Errorf("UniformLen(%v) = %d, want %d", cs.segs, got, cs.want)
		}
	}
}

// TestWithoutKernels: the stripped module keeps every other entry and the
// header (what the stages' capability tests load).
func TestWithoutKernels(t *testing.T) {
	for _, ptx := range [][]byte{kernels.PTX, kernels.PTX90} {
		out := cudatest.WithoutKernels(ptx, "_blocks")
		for _, k := range []string{kernels.GatherKernel, kernels.ScatterWideKernel, kernels.GatherCompactKernel} {
			if !bytes.Contains(out, []byte(".entry "+k+"(")) {
				t.Errorf("%s dropped", k)
			}
		}
		if bytes.Contains(out, []byte(".entry "+kernels.GatherBlocksKernel)) || bytes.Contains(out, []byte(".entry "+kernels.ScatterBlocksKernel)) {
			t.Error("a block kernel is left")
		}
		if !bytes.HasPrefix(out, ptx[:bytes.Index(ptx, []byte(".entry"))-len("\t// .globl\tbounce_gather\n")]) {
			t.Error("header changed")
		}
	}
}
