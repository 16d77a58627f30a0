package wire

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

// fieldMessage builds a message of kind typ%5 from fuzzed fields: nums is
// read as little-endian 64-bit words for the counts, sizes, credits and
// runs, so the fuzzer mutates the structure (how many entries, which
// values) rather than the framing alone.
func fieldMessage(typ uint8, req uint64, chunk uint32, region uint64, nums []byte, s1, s2 string) Message {
	words := make([]uint64, 0, len(nums)/8)
	for len(nums) >= 8 {
		words = append(words, binary.LittleEndian.Uint64(nums))
		nums = nums[8:]
	}
	switch typ % 5 {
	case 0:
		w := &Want{Request: req, ChunkBytes: words, Endpoint: s1, TraceParent: s2}
		if chunk%2 == 1 && len(words) >= 3 {
			// The block-table form: a pool named by s1, the block length
			// and piece count from the words, the ids from the rest.
			b := &WantBlocks{Pool: s1, BlockLen: words[0], Pieces: words[1]}
			for _, x := range words[2:] {
				b.IDs = append(b.IDs, uint32(x), uint32(x>>32))
			}
			w.Blocks = b
		}
		return w
	case 1:
		g := &Grant{Request: req}
		for i := 0; i+4 <= len(words); i += 4 {
			g.Credits = append(g.Credits, Credit{Chunk: uint32(words[i]), Region: words[i+1], Addr: words[i+2], Len: words[i+3], Device: int32(words[i] >> 32)})
		}
		return g
	case 2:
		d := &Data{Request: req, Chunk: chunk, Region: region, TraceParent: s2}
		if len(words) == 2 { // the block-table form
			d.Pieces = PieceRange{First: words[0], Count: words[1]}
			return d
		}
		for i := 0; i+6 <= len(words); i += 6 {
			d.Runs = append(d.Runs, transfer.Run{RegionOff: words[i], Addr: words[i+1], Len: words[i+2], Count: words[i+3], RegionStride: words[i+4], AddrStride: words[i+5]})
		}
		return d
	case 3:
		return &Ack{Request: req, Chunk: chunk, Region: region}
	default:
		return &Nack{Request: req, Chunk: chunk, Code: NackCode(region), Reason: s1}
	}
}

// FuzzMessageFields is the structure-aware twin of FuzzUnmarshal: it fuzzes
// the fields of each message type. A message that encodes decodes to the
// same canonical bytes; one that does not is refused with one sentinel.
// Then one byte of the valid encoding is corrupted (at flip, by xor): the
// decoder refuses it with one sentinel or decodes a canonical message —
// never a panic. The body allocates only what the codec does, so a run
// measures the codec, not the harness.
func FuzzMessageFields(f *testing.F) {
	le := func(ws ...uint64) []byte {
		b := make([]byte, 8*len(ws))
		for i, w := range ws {
			binary.LittleEndian.PutUint64(b[8*i:], w)
		}
		return b
	}
	tp := testTraceParent
	// Seeds: each type with empty, typical and boundary fields.
	f.Add(uint8(0), uint64(7), uint32(0), uint64(0), []byte(nil), "", "", uint32(0), byte(0))
	f.Add(uint8(0), uint64(42), uint32(0), uint64(0), le(8<<20, 8<<20, 4096), "tcp://10.0.0.2:41000", tp, uint32(3), byte(0xff))
	f.Add(uint8(0), uint64(math.MaxUint64), uint32(0), uint64(0), le(0, math.MaxUint64), "x", "", uint32(17), byte(1))
	f.Add(uint8(1), uint64(1), uint32(0), uint64(0), le(0, 0, 0x7f0000000000, 1<<20), "", "", uint32(9), byte(0x80))
	f.Add(uint8(1), uint64(2), uint32(0), uint64(0), le(math.MaxUint32|5<<32, 1<<20, 0x1000, 2<<20, 1, 2<<20, 0x2000, 0), "", "", uint32(40), byte(2))
	f.Add(uint8(2), uint64(9), uint32(3), uint64(1<<20), le(0, 0x10000, 4096, 1, 0, 0), "", tp, uint32(20), byte(4))
	f.Add(uint8(2), uint64(9), uint32(3), uint64(1<<20), le(4096, 0x20000, 4096, 64, 4096, 16384, 1<<19, 0x90000, 32, 1, 7, 9), "", "", uint32(60), byte(0x10))
	f.Add(uint8(2), uint64(1), uint32(0), uint64(0), le(math.MaxUint64-1, math.MaxUint64-1, 1, 1, 0, 0, 0, 0, 1, math.MaxUint64, 0, 0), "", "", uint32(1), byte(0))
	f.Add(uint8(0), uint64(46), uint32(1), uint64(0), le(4096, 4, 7|3<<32), "kv", tp, uint32(50), byte(0x01))
	f.Add(uint8(2), uint64(46), uint32(1), uint64(8<<20), le(2048, 2048), "", "", uint32(30), byte(0x40))
	f.Add(uint8(3), uint64(5), uint32(1), uint64(2<<20), []byte(nil), "", "", uint32(8), byte(0x7f))
	f.Add(uint8(4), uint64(5), uint32(math.MaxUint32), uint64(NackBadRuns), []byte(nil), "runs outside the grant", "", uint32(30), byte(0x20))
	f.Add(uint8(4), uint64(5), uint32(0), uint64(0xffff), []byte(nil), "", "", uint32(2), byte(0xfe))
	f.Fuzz(func(t *testing.T, typ uint8, req uint64, chunk uint32, region uint64, nums []byte, s1, s2 string, flip uint32, xor byte) {
		m := fieldMessage(typ, req, chunk, region, nums, s1, s2)
		b, err := Marshal(m)
		if err != nil {
			classified(t, err)
			return
		}
		got, err := Unmarshal(b)
		if err != nil {
			t.Fatalf("%T that encodes does not decode: %v", m, err)
		}
		if got.Type() != m.Type() {
			t.Fatalf("decoded %v, encoded %v", got.Type(), m.Type())
		}
		again, err := Marshal(got)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("round trip of %T is not canonical: %v\n in  %x\n out %x", m, err, b, again)
		}
		if xor == 0 || len(b) == 0 {
			return
		}
		b[int(flip%uint32(len(b)))] ^= xor
		bad, err := Unmarshal(b)
		if err != nil {
			classified(t, err)
			return
		}
		out, err := Marshal(bad)
		if err != nil || !bytes.Equal(out, b) {
			t.Fatalf("a corrupted %T decoded to a non-canonical %T: %v", m, bad, err)
		}
	})
}
