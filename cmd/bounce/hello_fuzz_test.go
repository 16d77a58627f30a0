package main

import (
	"encoding/base64"
	"encoding/json"
	"testing"
)

// FuzzParseHello: any bytes given as a peer's descriptor line are accepted
// only whole and consistent, never panic, and round-trip when accepted.
func FuzzParseHello(f *testing.F) {
	good, _ := json.Marshal(hello{Name: "recv", Descriptor: base64.StdEncoding.EncodeToString([]byte("BNCE...")), BufferAddr: 0x500000000000, BufferLen: 1 << 30, Bounce: true})
	f.Add(good)
	f.Add([]byte(`{"name":"x","descriptor":"!!!","buffer_addr":1,"buffer_len":1}`))
	f.Add([]byte(`{"name":"x","descriptor":"QQ==","buffer_addr":18446744073709551615,"buffer_len":2}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, blob, err := parseHello(b)
		if err != nil {
			return
		}
		if h.Name == "" || h.BufferLen == 0 || len(blob) == 0 || h.BufferAddr+h.BufferLen < h.BufferAddr {
			t.Fatalf("accepted an inconsistent line: %+v", h)
		}
		again, _ := json.Marshal(h)
		h2, blob2, err := parseHello(again)
		if err != nil || h2 != h || string(blob2) != string(blob) {
			t.Fatalf("re-encoded line does not round-trip: %v", err)
		}
	})
}

// FuzzHelloDescriptor: a record read from a directory (a sender's hello
// has no buffer) yields a descriptor only when it names an agent and
// carries one, never panics, and agrees with parseHello where both accept.
func FuzzHelloDescriptor(f *testing.F) {
	sender, _ := json.Marshal(hello{Name: "prefill-0", Descriptor: base64.StdEncoding.EncodeToString([]byte("BNCE..."))})
	f.Add(sender)
	f.Add([]byte(`{"name":"","descriptor":"QQ=="}`))
	f.Add([]byte(`{"name":"x","descriptor":""}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		blob, err := helloDescriptor(b)
		if err != nil {
			return
		}
		var h hello
		if json.Unmarshal(b, &h) != nil || h.Name == "" || len(blob) == 0 {
			t.Fatalf("accepted a record without a name or descriptor: %q", b)
		}
		if _, blob2, err := parseHello(b); err == nil && string(blob2) != string(blob) {
			t.Fatalf("parseHello and helloDescriptor disagree on %q", b)
		}
	})
}
