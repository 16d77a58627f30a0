package wire

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var updateCorpus = flag.Bool("update-corpus", false, "rewrite the seed corpora under testdata/fuzz")

// classified fails unless err wraps exactly one sentinel.
func classified(t testing.TB, err error) {
	t.Helper()
	n := 0
	for _, s := range sentinels {
		if errors.Is(err, s) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("error %q wraps %d sentinels, want exactly 1", err, n)
	}
}

func FuzzUnmarshal(f *testing.F) {
	for _, e := range sampleEncodings() {
		if e.kind == "message" {
			f.Add(e.b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) { unmarshalBody(t, b) })
}

// unmarshalBody is FuzzUnmarshal's body (BenchmarkFuzzBodies times it).
func unmarshalBody(t testing.TB, b []byte) {
	{
		m, err := Unmarshal(b)
		if err != nil {
			classified(t, err)
			if m != nil {
				t.Fatalf("error %v with a message", err)
			}
			return
		}
		out, err := Marshal(m)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		// out == b: decoding it again would decode b again (no check).
		if !bytes.Equal(out, b) {
			t.Fatalf("encoding is not canonical:\n in  %x\n out %x", b, out)
		}
		if d, ok := m.(*Data); ok {
			var reused Data
			if err := UnmarshalData(b, &reused); err != nil || !reflect.DeepEqual(d, &reused) {
				t.Fatalf("UnmarshalData disagrees: %+v, %v", reused, err)
			}
		}
	}
}

func FuzzUnmarshalHandshake(f *testing.F) {
	for _, e := range sampleEncodings() {
		if e.kind == "handshake" {
			f.Add(e.b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) { handshakeBody(t, b) })
}

// handshakeBody is FuzzUnmarshalHandshake's body.
func handshakeBody(t testing.TB, b []byte) {
	{
		h, err := UnmarshalHandshake(b)
		if err != nil {
			classified(t, err)
			if h != (Handshake{}) {
				t.Fatalf("error %v with a handshake", err)
			}
			return
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("decoded handshake fails Validate: %v", err)
		}
		out := MarshalHandshake(h)
		if !bytes.Equal(out, b) {
			t.Fatalf("encoding is not canonical:\n in  %x\n out %x", b, out)
		}
	}
}

func FuzzUnmarshalAgentDesc(f *testing.F) {
	for _, e := range sampleEncodings() {
		if e.kind == "agentdesc" {
			f.Add(e.b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) { agentDescBody(t, b) })
}

// agentDescBody is FuzzUnmarshalAgentDesc's body.
func agentDescBody(t testing.TB, b []byte) {
	{
		d, err := UnmarshalAgentDesc(b)
		if err != nil {
			classified(t, err)
			if !reflect.DeepEqual(d, AgentDesc{}) {
				t.Fatalf("error %v with a descriptor", err)
			}
			return
		}
		if d.HandshakeErr != nil {
			// An undecodable handshake keeps the descriptor usable without
			// one; the canonical-encoding check does not apply.
			classified(t, d.HandshakeErr)
			if d.Handshake != nil {
				t.Fatalf("HandshakeErr %v with a handshake", d.HandshakeErr)
			}
			return
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("decoded descriptor fails Validate: %v", err)
		}
		out := MarshalAgentDesc(d)
		if !bytes.Equal(out, b) {
			t.Fatalf("encoding is not canonical:\n in  %x\n out %x", b, out)
		}
	}
}

// BenchmarkFuzzBodies times one execution of each byte-input fuzz body
// over its seed corpus (valid and invalid seeds): the per-exec cost of the
// target itself, against which the fuzzing engine's execs/s shows whether
// a target or the engine is the bound.
func BenchmarkFuzzBodies(b *testing.B) {
	bodies := map[string]func(testing.TB, []byte){
		"FuzzUnmarshal": unmarshalBody, "FuzzUnmarshalHandshake": handshakeBody, "FuzzUnmarshalAgentDesc": agentDescBody,
	}
	for name, seeds := range seedCorpora() {
		body := bodies[name]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				body(b, seeds[i%len(seeds)].b)
			}
		})
	}
}

// seed is one corpus entry; valid seeds must decode, the others must not.
type seed struct {
	name  string
	b     []byte
	valid bool
}

// seedCorpora is what testdata/fuzz holds: every sample encoding plus a few
// invalid inputs that start the fuzzer near each error path.
func seedCorpora() map[string][]seed {
	out := map[string][]seed{}
	enc := map[string][]byte{}
	for _, e := range sampleEncodings() {
		fuzzName := map[string]string{"message": "FuzzUnmarshal", "handshake": "FuzzUnmarshalHandshake", "agentdesc": "FuzzUnmarshalAgentDesc"}[e.kind]
		out[fuzzName] = append(out[fuzzName], seed{"valid-" + e.name, e.b, true})
		enc[e.name] = e.b
	}
	data, hs, ad := enc["data-mixed"], enc["handshake-typical"], enc["agentdesc-typical"]
	badMagic := slices.Clone(data)
	badMagic[0] = 'X'
	badVersion := slices.Clone(data)
	badVersion[4] = 9
	out["FuzzUnmarshal"] = append(out["FuzzUnmarshal"],
		seed{"invalid-truncated-data", data[:len(data)/2], false},
		seed{"invalid-bad-magic", badMagic, false},
		seed{"invalid-bad-version", badVersion, false},
		seed{"invalid-handshake", hs, false},
		seed{"invalid-absurd-count", rawHeader(TypeData).u64(1).u32(0).u64(0).str("").u32(0xffffffff), false},
		seed{"invalid-trailing", append(slices.Clone(enc["ack-max"]), 0), false},
		seed{"invalid-want-tag-too-long", rawHeader(TypeWant).u64(1).u32(0).str("").str("").str(strings.Repeat("t", MaxTag+1)), false},
		seed{"invalid-done-truncated", enc["done-typical"][:len(enc["done-typical"])-1], false},
		seed{"invalid-want-blocks-dividing", rawHeader(TypeWant).u64(1).u32(1).u64(4096).str("").str("").str("").u8(1).str("kv").u64(4096).u64(3).u32(2).u32(1).u32(2), false},
		seed{"invalid-want-form", rawHeader(TypeWant).u64(1).u32(1).u64(4096).str("").str("").str("").u8(2), false},
		seed{"invalid-data-blocks-count-zero", rawHeader(TypeData).u64(1).u32(0).u64(0).str("").u32(0).u64(5).u64(0), false},
	)
	out["FuzzUnmarshalHandshake"] = append(out["FuzzUnmarshalHandshake"],
		seed{"invalid-truncated", hs[:len(hs)-1], false},
		seed{"invalid-agentdesc", ad, false},
	)
	out["FuzzUnmarshalAgentDesc"] = append(out["FuzzUnmarshalAgentDesc"],
		seed{"invalid-truncated", ad[:len(ad)-3], false},
		seed{"invalid-message", enc["want-typical"], false},
		seed{"invalid-pools-truncated", enc["agentdesc-pools"][:len(enc["agentdesc-pools"])-4], false},
	)
	return out
}

func corpusFile(b []byte) string { return fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b) }

func parseCorpusFile(s string) ([]byte, error) {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) != 2 || lines[0] != "go test fuzz v1" {
		return nil, fmt.Errorf("not a one-value corpus file")
	}
	lit, ok := strings.CutPrefix(lines[1], "[]byte(")
	if !ok || !strings.HasSuffix(lit, ")") {
		return nil, fmt.Errorf("value is not []byte(...)")
	}
	v, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
	return []byte(v), err
}

// TestSeedCorpus checks the checked-in corpora against the current codec:
// every seed is present, byte-identical to today's encoding, and decodes (or
// fails) as its name says. Run with -update-corpus to rewrite them.
func TestSeedCorpus(t *testing.T) {
	decoders := map[string]func([]byte) error{
		"FuzzUnmarshal": decodeMessage, "FuzzUnmarshalHandshake": decodeHandshake, "FuzzUnmarshalAgentDesc": decodeAgentDesc,
	}
	for fuzzName, seeds := range seedCorpora() {
		dir := filepath.Join("testdata", "fuzz", fuzzName)
		if *updateCorpus {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, s := range seeds {
				if err := os.WriteFile(filepath.Join(dir, s.name), []byte(corpusFile(s.b)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, s := range seeds {
			text, err := os.ReadFile(filepath.Join(dir, s.name))
			if err != nil {
				t.Fatalf("%s/%s missing (run go test -run TestSeedCorpus -update-corpus): %v", fuzzName, s.name, err)
			}
			b, err := parseCorpusFile(string(text))
			if err != nil {
				t.Fatalf("%s/%s: %v", fuzzName, s.name, err)
			}
			if !bytes.Equal(b, s.b) {
				t.Fatalf("%s/%s is stale: the codec now encodes it differently (run -update-corpus)", fuzzName, s.name)
			}
			if err := decoders[fuzzName](b); (err == nil) != s.valid {
				t.Fatalf("%s/%s: decode error %v, valid=%v", fuzzName, s.name, err, s.valid)
			}
		}
	}
}
