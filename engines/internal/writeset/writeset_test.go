package writeset

import (
	"errors"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

type op struct {
	ops      []transfer.WriteOp
	from, to string
}

func (o *op) Writes() []transfer.WriteOp { return o.ops }
func (o *op) From() string               { return o.from }
func (o *op) To() string                 { return o.to }

func host(addr, n uint64) transfer.Desc {
	return transfer.Desc{Addr: addr, Len: n, Kind: transfer.Host}
}

func TestInUse(t *testing.T) {
	w := &op{ops: []transfer.WriteOp{{Src: host(100, 10), Dst: host(500, 10)}}, from: "a", to: "b"}
	out := map[*op]struct{}{w: {}}
	in := map[*op]struct{}{w: {}}
	for _, tc := range []struct {
		name      string
		d         transfer.Desc
		out, in   map[*op]struct{}
		wantInUse string
	}{
		{"source's last byte", host(109, 1), out, nil, `source of a write to "b" in flight`},
		{"source's first byte", host(90, 11), out, nil, `source of a write to "b" in flight`},
		{"just past the source", host(110, 50), out, nil, ""},
		{"just before the source", host(90, 10), out, nil, ""},
		{"destination", host(505, 100), nil, in, `destination of a write from "a" in flight`},
		{"a destination is not checked as a source", host(500, 10), out, nil, ""},
		{"a source is not checked as a destination", host(100, 10), nil, in, ""},
	} {
		err := InUse(tc.d, tc.out, tc.in)
		switch {
		case tc.wantInUse == "" && err != nil:
			t.Errorf("%s: %v; want nil", tc.name, err)
		case tc.wantInUse != "" && (!errors.Is(err, transfer.ErrInUse) || !strings.Contains(err.Error(), tc.wantInUse)):
			t.Errorf("%s: %v; want ErrInUse naming %q", tc.name, err, tc.wantInUse)
		}
	}
}

type cudaOnly struct{}

func (cudaOnly) MemoryKinds() []transfer.MemKind { return []transfer.MemKind{transfer.CUDA} }

func TestCheckPost(t *testing.T) {
	cuda := transfer.Desc{Addr: 1, Len: 8, Kind: transfer.CUDA}
	for _, tc := range []struct {
		name string
		x    any
		ops  []transfer.WriteOp
		is   error
		msg  string
	}{
		{"none", nil, nil, nil, "no writes"},
		{"lengths differ", nil, []transfer.WriteOp{{Src: host(1, 8), Dst: host(64, 8)}, {Src: host(1, 8), Dst: host(64, 4)}}, transfer.ErrOutOfBounds, "write 1: source length 8, destination length 4"},
		{"empty", nil, []transfer.WriteOp{{Src: host(1, 0), Dst: host(64, 0)}}, transfer.ErrOutOfBounds, "write 0: source length 0"},
		{"cuda to an engine of host memory", nil, []transfer.WriteOp{{Src: cuda, Dst: host(64, 8)}}, transfer.ErrUnsupported, "write 0: eng cannot touch cuda memory"},
		{"host to an engine of cuda memory", cudaOnly{}, []transfer.WriteOp{{Src: cuda, Dst: host(64, 8)}}, transfer.ErrUnsupported, "cannot touch host memory"},
		{"fine", cudaOnly{}, []transfer.WriteOp{{Src: cuda, Dst: cuda}}, nil, ""},
	} {
		err := CheckPost(tc.x, "eng", tc.ops)
		if tc.msg == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.msg) || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("%s: %v; want %q (%v)", tc.name, err, tc.msg, tc.is)
		}
	}
}
