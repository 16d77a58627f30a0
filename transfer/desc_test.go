package transfer

import (
	"errors"
	"math"
	"math/big"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// TestRunSpansAgainstBigInts checks RegionSpan/AddrSpan and Contains against
// exact big-integer arithmetic, including overflowing inputs.
func TestRunSpansAgainstBigInts(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		edge := rapid.SampledFrom([]uint64{0, 1, 4096, math.MaxUint64 / 2, math.MaxUint64 - 1, math.MaxUint64})
		pick := rapid.OneOf(edge, rapid.Uint64(), rapid.Uint64Range(0, 1<<20))
		r := Run{Addr: pick.Draw(t, "addr"), Len: pick.Draw(t, "len"), Count: pick.Draw(t, "count"), AddrStride: pick.Draw(t, "stride")}
		start, end, ok := r.AddrSpan()
		if r.Count == 0 {
			if !ok || start != end {
				t.Fatalf("empty run: %d %d %v", start, end, ok)
			}
			return
		}
		steps := new(big.Int).SetUint64(r.Count - 1)
		if r.Count == 1 {
			steps.SetUint64(0)
		}
		want := new(big.Int).Mul(steps, new(big.Int).SetUint64(r.AddrStride))
		want.Add(want, new(big.Int).SetUint64(r.Addr))
		want.Add(want, new(big.Int).SetUint64(r.Len))
		fits := want.IsUint64()
		if ok != fits {
			t.Fatalf("AddrSpan ok=%v but exact end %v fits=%v", ok, want, fits)
		}
		if ok && (start != r.Addr || end != want.Uint64()) {
			t.Fatalf("AddrSpan = [%d,%d), want [%d,%v)", start, end, r.Addr, want)
		}
	})
}

func TestContains(t *testing.T) {
	d := Desc{Addr: 100, Len: 50}
	for _, c := range []struct {
		addr, n uint64
		want    bool
	}{
		{100, 50, true}, {100, 51, false}, {149, 1, true}, {150, 0, true}, {150, 1, false},
		{99, 1, false}, {120, math.MaxUint64, false}, {math.MaxUint64, 2, false},
	} {
		if got := d.Contains(c.addr, c.n); got != c.want {
			t.Errorf("Contains(%d, %d) = %v, want %v", c.addr, c.n, got, c.want)
		}
	}
	if Done.String() != "done" || !Failed.Terminal() || Pending.Terminal() {
		t.Fatal("status helpers")
	}
}

type cudaOnly struct{}

func (cudaOnly) MemoryKinds() []MemKind { return []MemKind{CUDA} }

func TestHandlesAndCheckKinds(t *testing.T) {
	if !Handles(struct{}{}, Host) || Handles(struct{}{}, CUDA) {
		t.Fatal("an implementation without MemoryKinds must handle host memory only")
	}
	if Handles(cudaOnly{}, Host) || !Handles(cudaOnly{}, CUDA) {
		t.Fatal("declared kinds ignored")
	}
	ds := []Desc{{Addr: 1, Len: 1, Kind: CUDA}, {Addr: 2, Len: 1, Kind: Host}}
	err := CheckKinds(cudaOnly{}, "the stage", ds)
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "descriptor 1") || !strings.Contains(err.Error(), "host memory") {
		t.Fatalf("CheckKinds = %v, want ErrUnsupported naming descriptor 1 and host memory", err)
	}
	if err := CheckKinds(struct{}{}, "x", ds[1:]); err != nil {
		t.Fatal(err)
	}
}

type stagesCUDA struct{}

func (stagesCUDA) StagedMemoryKinds() []MemKind { return []MemKind{CUDA} }

type stagesAndHandlesCUDA struct{ cudaOnly }

func (stagesAndHandlesCUDA) StagedMemoryKinds() []MemKind { return []MemKind{CUDA} }

// Stages is true only for a kind an implementation stages and does not
// handle natively; staging a kind does not make Handles true.
func TestStages(t *testing.T) {
	if !Stages(stagesCUDA{}, CUDA) || Handles(stagesCUDA{}, CUDA) || Stages(stagesCUDA{}, Host) {
		t.Fatal("a staged kind: Stages true, Handles false; host is not staged")
	}
	if Stages(struct{}{}, CUDA) || Stages(stagesAndHandlesCUDA{}, CUDA) {
		t.Fatal("Stages true without StagedKinder, or for a kind handled natively")
	}
}
