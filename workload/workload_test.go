package workload

import (
	"strings"
	"testing"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

func TestPresetsMatchTheSizingTable(t *testing.T) {
	want := map[string][2]uint64{ // name -> {desc size, count}
		"llama70b-tp8-b16":   {4 << 10, 81920},
		"llama70b-tp8-b64":   {16 << 10, 20480},
		"llama70b-tp1-b32":   {64 << 10, 40960},
		"gptoss120b-tp8-b16": {2 << 10, 36864},
		"gptoss120b-tp8-b64": {8 << 10, 9216},
	}
	for name, w := range want {
		p, err := Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		if p.DescSize != w[0] || uint64(p.Count) != w[1] {
			t.Fatalf("%s = %d x %d, want %d x %d", name, p.Count, p.DescSize, w[1], w[0])
		}
	}
	if p, _ := Lookup("llama70b-tp8-b16"); p.Bytes() != 320<<20 {
		t.Fatalf("llama70b-tp8-b16 = %d bytes, want 320 MiB", p.Bytes())
	}
	if p, _ := Lookup("llama70b-tp1-b16"); p.Bytes() != 2560<<20 {
		t.Fatalf("llama70b-tp1-b16 = %d bytes, want 2.5 GiB", p.Bytes())
	}
	if _, err := Lookup("nope"); err == nil || !strings.Contains(err.Error(), "llama70b-tp8-b16") {
		t.Fatalf("unknown preset error should list the accepted names: %v", err)
	}
}

func TestFillVerifyRoundTrip(t *testing.T) {
	for _, frag := range []bool{false, true} {
		s := Spec{DescSize: 4100, Count: 300, Fragmented: frag, Seed: 7}
		src, dst := make([]byte, s.Bytes()), make([]byte, s.Bytes())
		if err := s.Fill(src); err != nil {
			t.Fatal(err)
		}
		sd, dd := s.Descs(mem.DescOf(src), mem.DescOf(dst))
		for i := range sd {
			so := sd[i].Addr - mem.DescOf(src).Addr
			do := dd[i].Addr - mem.DescOf(dst).Addr
			copy(dst[do:do+dd[i].Len], src[so:so+sd[i].Len])
		}
		if err := s.Verify(dst); err != nil {
			t.Fatal(err)
		}
		dst[1234] ^= 1
		if err := s.Verify(dst); err == nil {
			t.Fatal("a flipped bit passed verification")
		}
		// Another seed's bytes fail: cross-talk shows.
		other := s
		other.Seed = 8
		dst[1234] ^= 1
		if err := other.Verify(dst); err == nil {
			t.Fatal("seed 7's bytes verified as seed 8's")
		}
	}
}

func TestFragmentedShuffles(t *testing.T) {
	s := Spec{DescSize: 64, Count: 1000, Fragmented: true, Seed: 1}
	src, _ := s.slots()
	moved := 0
	for i, v := range src {
		if v != i {
			moved++
		}
	}
	if moved < 900 {
		t.Fatalf("only %d of 1000 blocks moved slot: not fragmented", moved)
	}
	again, _ := s.slots()
	for i := range src {
		if src[i] != again[i] {
			t.Fatal("layout not reproducible from the seed")
		}
	}
}

func TestVerifyAllocatesNothingAndCatchesTails(t *testing.T) {
	s := Spec{DescSize: 1<<20 + 5, Count: 3, Seed: 9}
	src := make([]byte, s.Bytes())
	if err := s.Fill(src); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(3, func() {
		if err := s.Verify(src); err != nil {
			t.Fatal(err)
		}
	}); n > 2 { // the slot tables only, never a block-sized copy
		t.Fatalf("Verify allocated %v times per run", n)
	}
	src[s.DescSize-1] ^= 0xff // the last byte of a block with an odd tail
	if err := s.Verify(src); err == nil || !strings.Contains(err.Error(), "byte 1048580") {
		t.Fatalf("tail corruption: %v", err)
	}
}

func TestPresetsBlockTables(t *testing.T) {
	want := map[string][3]int{ // name -> regions, ids, pieces
		"llama70b-tp8-b16":   {160, 512, 81920},
		"llama70b-tp8-b32":   {160, 256, 40960},
		"llama70b-tp8-b64":   {160, 128, 20480},
		"gptoss120b-tp8-b16": {72, 512, 36864},
		"gptoss120b-tp8-b32": {72, 256, 18432},
		"gptoss120b-tp8-b64": {72, 128, 9216},
	}
	for name, w := range want {
		p, err := Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		if p.Regions() != w[0] || p.IDs() != w[1] || p.Regions()*p.IDs() != w[2] {
			t.Errorf("%s: %d regions x %d ids, want %d x %d = %d", name, p.Regions(), p.IDs(), w[0], w[1], w[2])
		}
		s := Spec{DescSize: p.DescSize, Count: p.Count, Regions: p.Regions(), Fragmented: true, Seed: 3}
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		src, _ := s.Blocks(transfer.Desc{Addr: 1 << 40, Len: s.Bytes()}, transfer.Desc{Addr: 1 << 41, Len: s.Bytes()})
		if err := src.Pool.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if src.Len() != uint64(p.Count) || src.Pool.BlockLen != p.DescSize {
			t.Errorf("%s: table of %d pieces of %d", name, src.Len(), src.Pool.BlockLen)
		}
	}
}

// The block tables name exactly the pieces Descs lists, and a copy made
// piece by piece from the tables verifies.
func TestBlocksAreTheDescs(t *testing.T) {
	for _, frag := range []bool{false, true} {
		s := Spec{DescSize: 100, Count: 6 * 37, Regions: 6, Fragmented: frag, Seed: 11}
		src, dst := make([]byte, s.Bytes()), make([]byte, s.Bytes())
		if err := s.Fill(src); err != nil {
			t.Fatal(err)
		}
		sd, dd := s.Descs(mem.DescOf(src), mem.DescOf(dst))
		sb, db := s.Blocks(mem.DescOf(src), mem.DescOf(dst))
		if sb.Len() != uint64(len(sd)) {
			t.Fatalf("%d pieces, %d descriptors", sb.Len(), len(sd))
		}
		for q := range sd {
			if sb.Piece(uint64(q)) != sd[q] || db.Piece(uint64(q)) != dd[q] {
				t.Fatalf("fragmented %v: piece %d = %v -> %v, descriptor %v -> %v", frag, q, sb.Piece(uint64(q)), db.Piece(uint64(q)), sd[q], dd[q])
			}
			copy(mem.Unsafe(dd[q].Addr, dd[q].Len), mem.Unsafe(sd[q].Addr, sd[q].Len))
		}
		if err := s.Verify(dst); err != nil {
			t.Fatal(err)
		}
		ids, _ := s.IDs()
		contiguous := true
		for i, id := range ids {
			contiguous = contiguous && id == uint32(i)
		}
		if contiguous == frag {
			t.Errorf("fragmented %v: ids %v", frag, ids)
		}
	}
	if err := (Spec{DescSize: 1, Count: 10, Regions: 3}).Validate(); err == nil {
		t.Error("3 regions of 10 pieces validated")
	}
}
