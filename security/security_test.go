package security

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"
	"pgregory.net/rapid"
)

func TestZ85MatchesLibzmq(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := rapid.SliceOfN(rapid.Byte(), 32, 32).Draw(t, "key")
		got := z85Encode(b)
		if want := zmq4.Z85encode(string(b)); got != want {
			t.Fatalf("z85 %q, libzmq %q", got, want)
		}
		back, err := z85Decode(got)
		if err != nil || string(back) != string(b) {
			t.Fatalf("round trip: %x, %v", back, err)
		}
	})
}

func TestGeneratedKeyIsLibzmqCurveKey(t *testing.T) {
	id, err := Generate(nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := zmq4.AuthCurvePublic(id.SecretZ85())
	if err != nil {
		t.Fatal(err)
	}
	if pub != id.Public.String() {
		t.Fatalf("libzmq derives public %s from our secret, we have %s", pub, id.Public)
	}
}

func TestKeyFileLifeCycle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.key")
	id, created, err := LoadOrCreate(path)
	if err != nil || !created {
		t.Fatalf("create: %v, created %v", err, created)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %o, want 600", st.Mode().Perm())
	}
	again, created, err := LoadOrCreate(path)
	if err != nil || created || again != id {
		t.Fatalf("reload: %v created=%v same=%v", err, created, again == id)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreate(path); !errors.Is(err, ErrKeyFileMode) || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("world-readable key file: %v, want ErrKeyFileMode naming the fix", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.key")
	other, _ := Generate(nil)
	os.WriteFile(bad, []byte("public "+other.Public.String()+"\nsecret "+id.SecretZ85()+"\n"), 0o600)
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("mismatched public key: %v", err)
	}
}

func TestParseKeyRejects(t *testing.T) {
	for _, s := range []string{"", "short", strings.Repeat("0", 40), strings.Repeat("~", 40), strings.Repeat("#", 40)} {
		if _, err := ParseKey(s); err == nil {
			t.Errorf("ParseKey(%q) accepted", s)
		}
	}
}

func TestPolicyAndPeers(t *testing.T) {
	a, _ := Generate(nil)
	b, _ := Generate(nil)
	file := filepath.Join(t.TempDir(), "peers")
	os.WriteFile(file, []byte("# team\nbob "+b.Public.String()+"\n"), 0o644)
	pol, err := ParsePolicy("alice="+a.Public.String()+", @"+file, os.ReadFile)
	if err != nil {
		t.Fatal(err)
	}
	if pol.Loaded || len(pol.Static) != 2 {
		t.Fatalf("policy %+v", pol)
	}
	self, _ := Generate(nil)
	p := NewPeers(Authenticate, self, pol)
	if err := p.Check("alice", a.Public); err != nil {
		t.Fatal(err)
	}
	if err := p.Check("bob", a.Public); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("alice's key claiming bob: %v", err)
	}
	c, _ := Generate(nil)
	if err := p.Introduce("carol", c.Public); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("loaded peer admitted without %q: %v", LoadedPeers, err)
	}
	if err := p.Introduce("alice", c.Public); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("descriptor with a key other than the listed one: %v", err)
	}

	p = NewPeers(Authenticate, self, Policy{Loaded: true})
	if err := p.Introduce("carol", c.Public); err != nil {
		t.Fatal(err)
	}
	if err := p.Introduce("mallory", c.Public); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("one key, two names: %v", err)
	}
	if err := p.Introduce("dave", Key{}); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("zero key: %v", err)
	}
	if !p.Admitted("carol") || p.Admitted("mallory") {
		t.Fatal("admitted set wrong")
	}
	p.Forget("carol")
	if p.Admitted("carol") {
		t.Fatal("forgotten peer still admitted")
	}
	for _, bad := range []string{"x", "=k", "a=" + a.Public.String() + ",b=" + a.Public.String(), "@/nonexistent/file"} {
		if _, err := ParsePolicy(bad, os.ReadFile); err == nil {
			t.Errorf("ParsePolicy(%q) accepted", bad)
		}
	}
}

// TestBucketProperty: over any sequence of instants, the tokens granted in
// a window never exceed Burst + Rate × window length.
func TestBucketProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rate := rapid.Float64Range(1, 1000).Draw(t, "rate")
		burst := float64(rapid.IntRange(1, 100).Draw(t, "burst"))
		b := Bucket{Rate: rate, Burst: burst}
		t0 := time.Unix(1000, 0)
		now := t0
		granted := 0
		for _, step := range rapid.SliceOf(rapid.Int64Range(0, int64(50*time.Millisecond))).Draw(t, "steps") {
			now = now.Add(time.Duration(step))
			if b.Allow(now) {
				granted++
			}
		}
		if limit := burst + rate*now.Sub(t0).Seconds(); float64(granted) > limit+1e-9 {
			t.Fatalf("granted %d > burst %v + rate %v × %v", granted, burst, rate, now.Sub(t0))
		}
	})
}

func FuzzParsePolicy(f *testing.F) {
	id, _ := Generate(nil)
	f.Add("loaded")
	f.Add("a=" + id.Public.String())
	f.Add("loaded, b=" + id.Public.String() + ",")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePolicy(s, func(string) ([]byte, error) { return nil, os.ErrNotExist })
		if err != nil {
			return
		}
		seen := map[Key]bool{}
		for _, k := range p.Static {
			if k.IsZero() || seen[k] {
				t.Fatalf("policy of %q holds a zero or duplicate key", s)
			}
			seen[k] = true
		}
	})
}
