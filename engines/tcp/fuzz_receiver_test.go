package tcp

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// relocate rewrites, frame by frame, the segment addresses of WRITE and
// READ frames in b from offsets to base+offset (wrapping), so seeds can aim
// at memory whose address differs per run. Everything else passes
// unchanged.
func relocate(b []byte, base uint64) []byte {
	out := append([]byte(nil), b...)
	rest := out
	for len(rest) >= headerSize {
		bodyLen := uint64(binary.LittleEndian.Uint32(rest[4:8]))
		if rest[0] != frameWrite && rest[0] != frameRead {
			if uint64(len(rest)) < headerSize+bodyLen {
				break
			}
			rest = rest[headerSize+bodyLen:]
			continue
		}
		body := rest[headerSize:]
		if uint64(len(body)) < bodyLen || bodyLen < 4 {
			break
		}
		var payload uint64
		for i := uint64(4); i+16 <= bodyLen; i += 16 {
			a := binary.LittleEndian.Uint64(body[i:])
			binary.LittleEndian.PutUint64(body[i:], a+base)
			if rest[0] == frameWrite { // a READ asks for its bytes: none follow
				payload += binary.LittleEndian.Uint64(body[i+8:])
			}
		}
		if uint64(len(body))-bodyLen < payload {
			break
		}
		rest = body[bodyLen+payload:]
	}
	return out
}

// FuzzReceiver sends a HELLO and then the fuzz input (WRITE and READ
// addresses taken relative to a registered region) to a live engine whose
// read guard allows the fuzzer that region alone. Whatever arrives, the
// engine must not write outside the registered region, must never send a
// byte of another registered region (a secret pattern the fuzzer cannot
// guess), must close or answer the connection rather than hang, and must
// keep serving.
func FuzzReceiver(f *testing.F) {
	v := newEnv(f)
	b := v.engine("b", func(c *Config) { c.IdleTimeout = time.Second; c.DialTimeout = time.Second })
	buf := v.buf(3*regionSize, 0, nil)
	region := sub(buf, regionSize, regionSize)
	if err := b.RegisterMemory(region); err != nil {
		f.Fatal(err)
	}
	b.SetReadGuard(allowRange("fuzzer", region))
	secretBuf := v.buf(regionSize, 0, b) // registered, never readable
	secret := make([]byte, 32)
	fill(secret, uint64(time.Now().UnixNano())|1)
	refill := func() {
		for s := secretBuf.Bytes(); len(s) > 0; s = s[min(len(s), len(secret)):] {
			copy(s, secret)
		}
	}
	refill()
	hello := helloFrame("fuzzer")
	zero := make([]byte, regionSize)
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(hangGuard))
		sent := make(chan struct{})
		go func() {
			// Send, then half-close so the engine sees the end of input.
			defer close(sent)
			(&net.Buffers{hello, relocate(in, region.Addr)}).WriteTo(c)
			c.(*net.TCPConn).CloseWrite()
		}()
		defer func() { <-sent }()
		var out bytes.Buffer
		if _, err := io.Copy(&out, io.LimitReader(c, 64<<20)); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("engine neither answered nor closed the connection")
			}
		}
		_, _ = io.Copy(io.Discard, c)
		if bytes.Contains(out.Bytes(), secret[:16]) {
			t.Fatal("engine sent bytes of a registered region its read guard does not allow")
		}
		refill()
		bs := buf.Bytes()
		if !bytes.Equal(bs[:regionSize], zero) || !bytes.Equal(bs[2*regionSize:], zero) {
			t.Fatal("engine wrote outside the registered region")
		}
		clear(bs[regionSize : 2*regionSize])
		// Drain notifications: a full receive queue stops the reading.
		for {
			if _, err := b.RecvNotification(0); err != nil {
				break
			}
		}
	})
}

const regionSize = 64 << 10
