package security

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestHostConnsAdmitsUpToTheCaps: one host's connections are admitted up
// to PerHost and refused past it, another host still gets its own, and
// the total counts each host at most PerHost.
func TestHostConnsAdmitsUpToTheCaps(t *testing.T) {
	c := HostConns{PerHost: 2, Total: 3}
	var got []bool
	for id := range 4 {
		c.Open(id, "a")
		got = append(got, c.Admit("a"))
	}
	// Connections 2 and 3 are refused while 0..3 are open: a holds 4.
	if want := []bool{true, true, false, false}; !slices.Equal(got, want) {
		t.Fatalf("host a admitted %v, want %v", got, want)
	}
	c.Open(10, "b")
	if !c.Admit("b") {
		t.Fatal("host b refused while a counts 2 of the total 3")
	}
	c.Open(11, "b")
	if c.Admit("b") {
		t.Fatal("host b admitted a 2nd connection: a (2) + b (2) > total 3")
	}
	c.Close(2)
	c.Close(3)
	c.Close(11)
	c.Close(99) // unknown: ignored
	if c.Live() != 3 || c.Of("a") != 2 || c.Of("b") != 1 || c.Hosts() != 2 {
		t.Fatalf("live %d, a %d, b %d, hosts %d; want 3, 2, 1, 2", c.Live(), c.Of("a"), c.Of("b"), c.Hosts())
	}
	// A close that was never reported: the id reopened replaces it.
	c.Open(0, "b")
	if c.Live() != 3 || c.Of("a") != 1 || c.Of("b") != 2 {
		t.Fatalf("after id 0 reopened for b: live %d, a %d, b %d; want 3, 1, 2", c.Live(), c.Of("a"), c.Of("b"))
	}
	for _, id := range []int{0, 1, 10} {
		c.Close(id)
	}
	if c.Live() != 0 || c.Hosts() != 0 || c.charged != 0 || c.held != 0 {
		t.Fatalf("all closed: live %d, hosts %d, charged %d, held %d", c.Live(), c.Hosts(), c.charged, c.held)
	}
	if c.Admit("a") {
		t.Fatal("a host with no open connection admitted")
	}
}

// TestHostConnsBurst: a host's connections all open before the first
// handshake asks: the first PerHost are admitted, the rest refused; as
// the refused ones close and then the admitted ones, the host is admitted
// again.
func TestHostConnsBurst(t *testing.T) {
	c := HostConns{PerHost: 3, Total: 100}
	for id := range 10 {
		c.Open(id, "a")
	}
	var got []bool
	for range 10 {
		got = append(got, c.Admit("a"))
	}
	if want := []bool{true, true, true, false, false, false, false, false, false, false}; !slices.Equal(got, want) {
		t.Fatalf("burst of 10 admitted %v, want the first 3", got)
	}
	for id := 3; id < 10; id++ { // the refused ones end
		c.Close(id)
	}
	c.Open(10, "a")
	if c.Admit("a") {
		t.Fatal("a 4th connection admitted while 3 admitted ones are open")
	}
	c.Close(10)
	c.Close(0) // an admitted one ends
	c.Open(11, "a")
	if !c.Admit("a") {
		t.Fatal("refused with 2 admitted connections open, cap 3")
	}
}

// TestHostConnsProperty: under any interleaving of opens, handshakes,
// closes and lost closes (an id reopened), the connections admitted and
// still open never exceed PerHost for a host nor Total in all; a
// connection is admitted whenever its host's open connections are within
// PerHost and all hosts' (each up to PerHost) within Total, and, when no
// connection but admitted ones is open, exactly when the admitted ones
// with it are within the caps; and once every connection closed nothing
// is counted.
func TestHostConnsProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		perHost := rapid.IntRange(1, 4).Draw(t, "perHost")
		total := rapid.IntRange(1, 8).Draw(t, "total")
		c := HostConns{PerHost: perHost, Total: total}
		type conn struct {
			host             string
			judged, admitted bool
		}
		live := map[int]*conn{}
		hosts := []string{"10.0.0.1", "10.0.0.2", "::1"}
		ids := rapid.IntRange(0, 15)
		check := func() {
			open, admitted := map[string]int{}, map[string]int{}
			all := 0
			for _, k := range live {
				open[k.host]++
				if k.admitted {
					admitted[k.host]++
					all++
				}
			}
			for _, h := range hosts {
				if admitted[h] > perHost {
					t.Fatalf("host %s holds %d admitted connections, cap %d", h, admitted[h], perHost)
				}
				if c.Of(h) != open[h] {
					t.Fatalf("Of(%s) = %d, %d open", h, c.Of(h), open[h])
				}
			}
			if all > total {
				t.Fatalf("%d admitted connections in all, cap %d", all, total)
			}
			if c.Live() != len(live) || c.Hosts() != len(open) {
				t.Fatalf("Live %d Hosts %d, model %d connections on %d hosts", c.Live(), c.Hosts(), len(live), len(open))
			}
		}
		steps := rapid.IntRange(1, 200).Draw(t, "steps")
		for range steps {
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0, 1: // open, or a lost close: the id reopened
				id := ids.Draw(t, "id")
				h := rapid.SampledFrom(hosts).Draw(t, "host")
				c.Open(id, h)
				live[id] = &conn{host: h}
			case 2: // a handshake asks
				id := ids.Draw(t, "id")
				k := live[id]
				if k == nil || k.judged {
					continue
				}
				charged, admittedHere, admittedAll, clean := 0, 0, 0, true
				for _, h := range hosts {
					n := 0
					for oid, o := range live {
						if o.host != h {
							continue
						}
						n++
						switch {
						case o.admitted:
							admittedAll++
							if h == k.host {
								admittedHere++
							}
						case oid != id:
							clean = false // refused or unjudged, still open
						}
					}
					charged += min(n, perHost)
				}
				openRule := c.Of(k.host) <= perHost && charged <= total
				k.judged = true
				k.admitted = c.Admit(k.host)
				if openRule && !k.admitted {
					t.Fatalf("Admit(%s) refused with %d open there and %d charged (caps %d, %d)", k.host, c.Of(k.host), charged, perHost, total)
				}
				if want := admittedHere+1 <= perHost && admittedAll+1 <= total; clean && k.admitted != want {
					t.Fatalf("Admit(%s) = %v with only admitted connections open (%d there, %d in all; caps %d, %d)", k.host, k.admitted, admittedHere, admittedAll, perHost, total)
				}
			case 3, 4: // a connection (admitted, refused or never judged) closes
				id := ids.Draw(t, "id")
				c.Close(id)
				delete(live, id)
			}
			check()
		}
		for id := range live {
			c.Close(id)
			delete(live, id)
			check()
		}
		if c.Live() != 0 || c.Hosts() != 0 || c.charged != 0 || c.held != 0 {
			t.Fatalf("all closed: live %d, hosts %d, charged %d, held %d", c.Live(), c.Hosts(), c.charged, c.held)
		}
	})
}
