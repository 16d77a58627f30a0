package pipeline

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// TestDataWritesOnlyUserMemory: a DATA whose runs stay inside the flow's
// grant but write the arena (another flow's region, or the flow's own),
// unregistered memory, or copy more bytes than the grant holds (a strided
// run read over and over) is NACKed with the reason before any byte is
// copied; a DATA into registered memory still lands.
func TestDataWritesOnlyUserMemory(t *testing.T) {
	w := newWorld(t)
	b := w.node("b", testConfig())
	dst := b.buffer(t, 1<<20)
	loose, err := mem.Alloc(1 << 20) // allocated, never registered
	if err != nil {
		t.Fatal(err)
	}
	defer loose.Free()
	im := newImpostor(t, w, b)
	arena := b.Arena()
	const grant = 64 << 10
	other := im.grant(t, b, 1, grant) // stands for another sender's flow
	otherBytes := mem.Unsafe(arena.Addr+other.Region, grant)
	for i := range otherBytes {
		otherBytes[i] = 0x5a
	}
	d := mem.DescOf(dst)
	cases := []struct {
		name string
		code wire.NackCode
		runs func(own wire.Credit) []transfer.Run
	}{
		{"another-flows-region", wire.NackForbidden, func(wire.Credit) []transfer.Run {
			return []transfer.Run{{Addr: arena.Addr + other.Region, Len: 4096, Count: 1}}
		}},
		{"own-region", wire.NackForbidden, func(own wire.Credit) []transfer.Run {
			return []transfer.Run{{RegionOff: 4096, Addr: arena.Addr + own.Region, Len: 4096, Count: 1}}
		}},
		{"strided-past-the-buffer", wire.NackForbidden, func(wire.Credit) []transfer.Run {
			return []transfer.Run{{Addr: d.End() - 2*4096, Len: 4096, Count: 4, RegionStride: 4096, AddrStride: 4096}}
		}},
		{"unregistered", wire.NackForbidden, func(wire.Credit) []transfer.Run {
			return []transfer.Run{{Addr: mem.DescOf(loose.Bytes()).Addr, Len: 4096, Count: 1}}
		}},
		{"more-than-the-grant", wire.NackBadRuns, func(wire.Credit) []transfer.Run {
			rs := make([]transfer.Run, 64) // 64 × the whole region
			for i := range rs {
				rs[i] = transfer.Run{Addr: d.Addr, Len: 4096, Count: grant / 4096, RegionStride: 4096, AddrStride: 4096}
			}
			return rs
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := uint64(10 + i)
			own := im.grant(t, b, req, grant)
			im.send(t, "b", &wire.Data{Request: req, Region: own.Region, Runs: tc.runs(own)})
			n, ok := im.recv(t, 5*time.Second).(*wire.Nack)
			if !ok || n.Request != req || n.Code != tc.code || !strings.HasPrefix(n.Reason, "DATA refused: ") {
				t.Fatalf("got %#v, want a NACK %v for request %d with the reason", n, tc.code, req)
			}
			if !bytes.Equal(dst, make([]byte, len(dst))) || !bytes.Equal(loose.Bytes(), make([]byte, len(loose.Bytes()))) {
				t.Fatal("bytes were written for a refused DATA")
			}
			if !bytes.Equal(otherBytes, bytes.Repeat([]byte{0x5a}, grant)) {
				t.Fatal("the other flow's region was overwritten")
			}
		})
	}
	if got := b.Stats().BadRuns; got != uint64(len(cases)) {
		t.Fatalf("BadRuns = %d, want %d", got, len(cases))
	}
	// Runs into registered memory, as many bytes as the grant holds, land.
	req := uint64(99)
	own := im.grant(t, b, req, grant)
	im.send(t, "b", &wire.Data{Request: req, Region: own.Region, Runs: []transfer.Run{{Addr: d.Addr, Len: 4096, Count: grant / 4096, RegionStride: 4096, AddrStride: 8192}}})
	if a, ok := im.recv(t, 5*time.Second).(*wire.Ack); !ok || a.Request != req {
		t.Fatalf("got %#v, want the ACK", a)
	}
	im.send(t, "b", &wire.Want{Request: 1, Endpoint: im.ch.LocalEndpoint()}) // cancel the other flow
	settled(t, b)
}

// TestScatterDestsPeers: with authentication on, memory registered for
// some peers takes DATA from them alone; memory registered for all from
// every peer; a strided run may cross registrations only where every copy
// lies in memory the peer may write.
func TestScatterDestsPeers(t *testing.T) {
	s := &scatterDests{byPeer: true}
	s.add(transfer.Desc{Addr: 1 << 20, Len: 1 << 20}, []string{"alice"})
	s.add(transfer.Desc{Addr: 4 << 20, Len: 1 << 20}, nil)
	s.add(transfer.Desc{Addr: 2 << 20, Len: 1 << 20}, []string{"alice", "bob"})
	one := func(addr uint64) []transfer.Run { return []transfer.Run{{Addr: addr, Len: 4096, Count: 1}} }
	for _, tc := range []struct {
		peer string
		runs []transfer.Run
		ok   bool
	}{
		{"alice", one(1 << 20), true},
		{"mallory", one(1 << 20), false},
		{"bob", one(1 << 20), false},
		{"bob", one(2 << 20), true},
		{"mallory", one(4 << 20), true},
		{"mallory", one(3 << 20), false}, // between registrations
		// 1 MiB stride: copies at 1, 2, 3 (unregistered) MiB.
		{"alice", []transfer.Run{{Addr: 1 << 20, Len: 4096, Count: 2, RegionStride: 4096, AddrStride: 1 << 20}}, true},
		{"bob", []transfer.Run{{Addr: 1 << 20, Len: 4096, Count: 2, RegionStride: 4096, AddrStride: 1 << 20}}, false},
		{"alice", []transfer.Run{{Addr: 1 << 20, Len: 4096, Count: 3, RegionStride: 4096, AddrStride: 1 << 20}}, false},
		// A copy straddling two adjacent registrations is refused.
		{"alice", one(2<<20 - 2048), false},
	} {
		err := s.check(tc.peer, tc.runs, 1<<20)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, transfer.ErrForbidden) {
			t.Errorf("%s %+v: err %v, want ok %v", tc.peer, tc.runs, err, tc.ok)
		}
	}
	s.remove(transfer.Desc{Addr: 4 << 20, Len: 1 << 20})
	if err := s.check("mallory", one(4<<20), 1<<20); !errors.Is(err, transfer.ErrForbidden) {
		t.Fatalf("deregistered memory: %v", err)
	}
	// Without authentication the names are not proven: registered memory
	// takes DATA from any peer.
	open := &scatterDests{}
	open.add(transfer.Desc{Addr: 1 << 20, Len: 1 << 20}, []string{"alice"})
	if err := open.check("mallory", one(1<<20), 1<<20); err != nil {
		t.Fatal(err)
	}
}

// TestScatterDestsProperty: check accepts exactly the runs a copy-by-copy
// oracle accepts: every copy reads inside the grant and writes inside one
// registered range the peer may write, and the copies total at most the
// grant.
func TestScatterDestsProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := &scatterDests{byPeer: true}
		var ranges []userRange
		addr := uint64(0)
		for range rapid.IntRange(0, 5).Draw(t, "ranges") {
			addr += rapid.Uint64Range(0, 64).Draw(t, "gap")
			n := rapid.Uint64Range(1, 64).Draw(t, "len")
			var peers []string
			if rapid.Bool().Draw(t, "restricted") {
				peers = []string{rapid.SampledFrom([]string{"alice", "bob"}).Draw(t, "for")}
			}
			d := transfer.Desc{Addr: addr, Len: n}
			s.add(d, peers)
			ranges = append(ranges, userRange{d: d, peers: peers})
			addr += n
		}
		grant := rapid.Uint64Range(1, 128).Draw(t, "grant")
		peer := rapid.SampledFrom([]string{"alice", "bob"}).Draw(t, "peer")
		var runs []transfer.Run
		for range rapid.IntRange(1, 4).Draw(t, "runs") {
			runs = append(runs, transfer.Run{
				RegionOff: rapid.Uint64Range(0, 64).Draw(t, "roff"), Addr: rapid.Uint64Range(0, addr+16).Draw(t, "addr"),
				Len: rapid.Uint64Range(0, 16).Draw(t, "n"), Count: rapid.Uint64Range(0, 6).Draw(t, "count"),
				RegionStride: rapid.Uint64Range(0, 24).Draw(t, "rs"), AddrStride: rapid.Uint64Range(0, 48).Draw(t, "as"),
			})
		}
		writable := func(a, n uint64) bool {
			for _, u := range ranges {
				if u.d.Contains(a, n) {
					return u.peers == nil || u.peers[0] == peer
				}
			}
			return false
		}
		want, total := true, uint64(0)
		for _, r := range runs {
			if r.Len == 0 || r.Count == 0 || r.Count > 1 && r.RegionStride < r.Len {
				want = false
			}
			for c := uint64(0); c < r.Count; c++ {
				ro, a := r.RegionOff+c*r.RegionStride, r.Addr+c*r.AddrStride
				if r.Count == 1 {
					ro, a = r.RegionOff, r.Addr
				}
				if ro+r.Len > grant || !writable(a, r.Len) {
					want = false
				}
				total += r.Len
			}
		}
		if total > grant {
			want = false
		}
		if err := s.check(peer, runs, grant); (err == nil) != want {
			t.Fatalf("check = %v, oracle says ok %v (ranges %v, grant %d, peer %s, runs %+v)", err, want, ranges, grant, peer, runs)
		}
	})
}
