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
