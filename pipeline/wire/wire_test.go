package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

// unhex decodes hex written with spaces and | separators for readability.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	s = strings.NewReplacer(" ", "", "|", "", "\n", "", "\t", "").Replace(s)
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex in test: %v", err)
	}
	return b
}

var sentinels = []error{ErrTruncated, ErrBadMagic, ErrBadVersion, ErrWrongType, ErrTooLarge, ErrTrailing, ErrMalformed}

// wantErr fails unless err wraps want and no other sentinel.
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: decoded without error, want %v", what, want)
	}
	if !errors.Is(err, want) {
		t.Fatalf("%s: error %q does not wrap %v", what, err, want)
	}
	for _, s := range sentinels {
		if s != want && errors.Is(err, s) {
			t.Fatalf("%s: error %q wraps %v as well as %v", what, err, s, want)
		}
	}
}

func TestGoldenBytes(t *testing.T) {
	cases := []struct {
		name string
		msg  Message
		hex  string
	}{
		{"ack", &Ack{Request: 0x0102030405060708, Chunk: 0x0a0b0c0d, Region: 0x1112131415161718, ScatterNS: 0x2122232425262728},
			"424e4345 0700 04 00 | 0807060504030201 | 0d0c0b0a | 1817161514131211 | 2827262524232221"},
		{"want", &Want{Request: 1, ChunkBytes: []uint64{0x100000}, Endpoint: "ab"},
			"424e4345 0700 01 00 | 0100000000000000 | 01000000 | 0000100000000000 | 0200 6162 | 0000 | 0000 | 00 | 0000000000000000"},
		{"want-cancel", &Want{Request: 2, TraceParent: "t"},
			"424e4345 0700 01 00 | 0200000000000000 | 00000000 | 0000 | 0100 74 | 0000 | 00 | 0000000000000000"},
		{"want-incarnation", &Want{Request: 2, Incarnation: 0x0102030405060708},
			"424e4345 0700 01 00 | 0200000000000000 | 00000000 | 0000 | 0000 | 0000 | 00 | 0807060504030201"},
		{"want-tagged", &Want{Request: 2, Tag: []byte{0xaa, 0xbb}},
			"424e4345 0700 01 00 | 0200000000000000 | 00000000 | 0000 | 0000 | 0200 aabb | 00 | 0000000000000000"},
		{"grant", &Grant{Request: 2, Credits: []Credit{{Chunk: 3, Region: 0x10, Addr: 0x2000, Len: 0x40, Device: 1, Kind: transfer.CUDA}}},
			"424e4345 0700 02 00 | 0200000000000000 | 01000000 | 1000000000000000 0020000000000000 4000000000000000 03000000 01000000 01"},
		{"data", &Data{Request: 3, Chunk: 1, Region: 0x20, TraceParent: "t", Runs: []transfer.Run{
			{RegionOff: 0, Addr: 0x1000, Len: 0x10, Count: 1},
			{RegionOff: 0x10, Addr: 0x2000, Len: 8, Count: 2, RegionStride: 8, AddrStride: 0x100},
		}},
			"424e4345 0700 03 00 | 0300000000000000 | 01000000 | 2000000000000000 | 0100 74 | 02000000 |" +
				"00 0000000000000000 0010000000000000 1000000000000000 |" +
				"01 1000000000000000 0020000000000000 0800000000000000 0200000000000000 0800000000000000 0001000000000000"},
		{"nack", &Nack{Request: 4, Chunk: WholeRequest, Code: NackShutdown, Reason: "x"},
			"424e4345 0700 05 00 | 0400000000000000 | ffffffff | 0400 | 0100 78"},
		{"done", &Done{Request: 5, Bytes: 0x1000, Endpoint: "e", Reason: "x", TraceParent: "tp", Tag: []byte("t")},
			"424e4345 0700 06 00 | 0500000000000000 | 0010000000000000 | 0100 65 | 0100 78 | 0200 7470 | 0100 74"},
		{"pull", &Pull{Request: 7, ChunkBytes: []uint64{0x40}, MinChunk: 0x10, Endpoint: "e", Tag: []byte("t"), Incarnation: 2,
			Credits: []Credit{{Chunk: 0, Region: 0x10, Addr: 0x2000, Len: 0x40}},
			Blocks:  &PullBlocks{SrcPool: "s", SrcIDs: []uint32{1, 2}}},
			"424e4345 0700 07 00 | 0700000000000000 | 01000000 4000000000000000 | 1000000000000000 | 0100 65 | 0000 | 0100 74 | 0200000000000000 | 00 |" +
				"01000000 1000000000000000 0020000000000000 4000000000000000 00000000 00000000 00 | 01 | 0100 73 | 02000000 01000000 02000000"},
		{"pull-read", &Pull{Request: 8, ChunkBytes: []uint64{0x40}, Src: []transfer.Desc{{Addr: 0x1000, Len: 0x40}}, Read: true},
			"424e4345 0700 07 00 | 0800000000000000 | 01000000 4000000000000000 | 0000000000000000 | 0000 | 0000 | 0000 | 0000000000000000 | 01 | 00000000 | 00 | 01000000 01000000 |" +
				"01000000 4000000000000000 00000000 00 0010000000000000 04 | 00000000"},
		{"staged", &Staged{Src: transfer.Desc{Addr: 0x7000, Len: 0x10}, Data: Data{Request: 3, Chunk: 1, Region: 0x20, Runs: []transfer.Run{{RegionOff: 0, Addr: 0x1000, Len: 0x10, Count: 1}}}},
			"424e4345 0700 09 00 | 0070000000000000 1000000000000000 00000000 00 | 0300000000000000 | 01000000 | 2000000000000000 | 0000 | 01000000 |" +
				"00 0000000000000000 0010000000000000 1000000000000000"},
		{"pull-end", &PullEnd{Request: 7, Code: NackForbidden, Reason: "x", Unproven: true},
			"424e4345 0700 08 00 | 0700000000000000 | 0a00 | 01 | 0100 78"},
	}
	for _, c := range cases {
		got, err := Marshal(c.msg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if want := unhex(t, c.hex); !bytes.Equal(got, want) {
			t.Fatalf("%s:\n got %x\nwant %x", c.name, got, want)
		}
	}

	h := Handshake{Version: 1, ControlKind: "zmq", ArenaCapacity: 0x100, MaxChunk: 0x80, Endpoint: "e"}
	wantH := unhex(t, "424e4345 0700 48 00 | 0100 | 0300 7a6d71 | 0001000000000000 | 8000000000000000 | 0100 65")
	if got := MarshalHandshake(h); !bytes.Equal(got, wantH) {
		t.Fatalf("handshake:\n got %x\nwant %x", got, wantH)
	}
	d := AgentDesc{Name: "n", Engine: []byte{0xaa}, PublicKey: [32]byte{0: 0x11, 31: 0x22}}
	key := "11" + strings.Repeat("00", 30) + "22"
	wantD := unhex(t, "424e4345 0700 41 00 | 0100 6e | 01000000 aa | "+key+" | 00 | 00000000")
	if got := MarshalAgentDesc(d); !bytes.Equal(got, wantD) {
		t.Fatalf("agent desc:\n got %x\nwant %x", got, wantD)
	}
	d.Handshake = &h
	wantDH := append(append(append(unhex(t, "424e4345 0700 41 00 | 0100 6e | 01000000 aa | "+key+" | 01"), byte(len(wantH)), 0, 0, 0), wantH...), 0, 0, 0, 0)
	if got := MarshalAgentDesc(d); !bytes.Equal(got, wantDH) {
		t.Fatalf("agent desc with handshake:\n got %x\nwant %x", got, wantDH)
	}
}

func TestRoundTripMessages(t *testing.T) {
	for _, s := range sampleMessages() {
		b, err := Marshal(s.msg)
		if err != nil {
			t.Fatalf("%s: marshal: %v", s.name, err)
		}
		n, err := EncodedLen(s.msg)
		if err != nil || n != len(b) {
			t.Fatalf("%s: EncodedLen = %d, %v; encoding is %d bytes", s.name, n, err, len(b))
		}
		got, err := Unmarshal(b)
		if err != nil {
			t.Fatalf("%s: unmarshal: %v", s.name, err)
		}
		if !reflect.DeepEqual(got, s.msg) {
			t.Fatalf("%s: round trip\n got %+v\nwant %+v", s.name, got, s.msg)
		}
		if typ, err := PeekType(b); err != nil || typ != s.msg.Type() {
			t.Fatalf("%s: PeekType = %v, %v", s.name, typ, err)
		}
		// AppendMarshal appends after existing bytes and leaves them alone.
		prefix := []byte("prefix")
		app, err := AppendMarshal(prefix, s.msg)
		if err != nil || !bytes.Equal(app[:6], []byte("prefix")) || !bytes.Equal(app[6:], b) {
			t.Fatalf("%s: AppendMarshal = %x, %v", s.name, app, err)
		}
	}
}

func TestRoundTripHandshakeAndAgentDesc(t *testing.T) {
	for _, s := range sampleHandshakes() {
		got, err := UnmarshalHandshake(MarshalHandshake(s.h))
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got != s.h {
			t.Fatalf("%s: got %+v want %+v", s.name, got, s.h)
		}
	}
	for _, s := range sampleAgentDescs() {
		if err := s.d.Validate(); err != nil {
			t.Fatalf("%s: Validate: %v", s.name, err)
		}
		got, err := UnmarshalAgentDesc(MarshalAgentDesc(s.d))
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if !reflect.DeepEqual(got, s.d) {
			t.Fatalf("%s: got %+v want %+v", s.name, got, s.d)
		}
	}
}

func TestWantIsCancel(t *testing.T) {
	if !(&Want{Request: 1, Endpoint: "x"}).IsCancel() {
		t.Fatal("empty ChunkBytes is not a cancel")
	}
	if (&Want{ChunkBytes: []uint64{1}}).IsCancel() {
		t.Fatal("a WANT with chunks is a cancel")
	}
	b, _ := Marshal(&Want{Request: 1, ChunkBytes: []uint64{}})
	m, err := Unmarshal(b)
	if err != nil || !m.(*Want).IsCancel() || m.(*Want).ChunkBytes != nil {
		t.Fatalf("decoded cancel = %+v, %v", m, err)
	}
}

func TestDecodedMessagesDoNotAliasInput(t *testing.T) {
	ad := AgentDesc{Name: "n", Engine: []byte("engine")}
	b := MarshalAgentDesc(ad)
	got, err := UnmarshalAgentDesc(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 0
	}
	if string(got.Engine) != "engine" || got.Name != "n" {
		t.Fatalf("decoded desc changed with its input: %+v", got)
	}
}

func TestTruncationAtEveryOffset(t *testing.T) {
	total := 0
	for _, e := range sampleEncodings() {
		for i := 0; i < len(e.b); i++ {
			wantErr(t, e.name+" cut at "+itoa(i), e.decode(e.b[:i]), ErrTruncated)
			total++
		}
		if err := e.decode(e.b); err != nil {
			t.Fatalf("%s: full encoding: %v", e.name, err)
		}
	}
	// UnmarshalData shares the DATA decoder but not its entry point.
	for _, s := range sampleMessages() {
		if s.msg.Type() != TypeData {
			continue
		}
		b, _ := Marshal(s.msg)
		var d Data
		for i := 0; i < len(b); i++ {
			wantErr(t, s.name+" UnmarshalData cut at "+itoa(i), UnmarshalData(b[:i], &d), ErrTruncated)
		}
	}
	if total < 1000 {
		t.Fatalf("only %d prefixes checked", total)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestBadMagic(t *testing.T) {
	for _, e := range sampleEncodings() {
		for i := range 4 {
			b := bytes.Clone(e.b)
			b[i] ^= 0x20
			wantErr(t, e.name+" magic byte "+itoa(i), e.decode(b), ErrBadMagic)
			// A short input that already disagrees with the magic is bad
			// magic, not truncation.
			wantErr(t, e.name+" short", e.decode(b[:i+1]), ErrBadMagic)
		}
	}
	wantErr(t, "json", decodeMessage([]byte(`{"type":"WANT"}`)), ErrBadMagic)
}

func TestBadVersion(t *testing.T) {
	for _, e := range sampleEncodings() {
		for _, v := range []uint16{0, Version - 1, Version + 1, math.MaxUint16} {
			b := bytes.Clone(e.b)
			le.PutUint16(b[4:], v)
			err := e.decode(b)
			wantErr(t, e.name+" version "+itoa(int(v)), err, ErrBadVersion)
			if !strings.Contains(err.Error(), "version "+itoa(int(v))) {
				t.Fatalf("error %q does not name the version", err)
			}
		}
	}
}

func TestCrossTypeDecode(t *testing.T) {
	ack, _ := Marshal(&Ack{Request: 1})
	hs := MarshalHandshake(sampleHandshakes()[1].h)
	ad := MarshalAgentDesc(sampleAgentDescs()[1].d)

	wantErr(t, "handshake as message", decodeMessage(hs), ErrWrongType)
	wantErr(t, "agent desc as message", decodeMessage(ad), ErrWrongType)
	wantErr(t, "message as handshake", decodeHandshake(ack), ErrWrongType)
	wantErr(t, "agent desc as handshake", decodeHandshake(ad), ErrWrongType)
	wantErr(t, "message as agent desc", decodeAgentDesc(ack), ErrWrongType)
	wantErr(t, "handshake as agent desc", decodeAgentDesc(hs), ErrWrongType)
	wantErr(t, "ACK as DATA", UnmarshalData(ack, new(Data)), ErrWrongType)
	if _, err := PeekType(hs); !errors.Is(err, ErrWrongType) {
		t.Fatalf("PeekType(handshake) = %v", err)
	}
	for _, typ := range []byte{0, 10, 0x47, 0xff} {
		b := bytes.Clone(ack)
		b[6] = typ
		wantErr(t, "type "+itoa(int(typ)), decodeMessage(b), ErrWrongType)
	}
	// The embedded handshake of an agent descriptor must be a handshake.
	b := bytes.Clone(ad)
	at := len(b) - len(hs) - 4 // the handshake, then the pool count
	b[at+6] = byte(TypeAck)
	wantErr(t, "agent desc with ACK as handshake", decodeAgentDesc(b), ErrWrongType)
}

// raw builds encodings field by field, for inputs no encoder produces.
type raw []byte

func rawHeader(t Type) raw     { return raw(appendHeader(nil, t)) }
func (r raw) u8(v uint8) raw   { return append(r, v) }
func (r raw) u16(v uint16) raw { return le.AppendUint16(r, v) }
func (r raw) u32(v uint32) raw { return le.AppendUint32(r, v) }
func (r raw) u64(v uint64) raw { return le.AppendUint64(r, v) }
func (r raw) str(s string) raw { return append(r.u16(uint16(len(s))), s...) }
func (r raw) zeros(n int) raw  { return append(r, make([]byte, n)...) }

// pullHead is a PULL of one 8-byte chunk, no credits, up to its form
// byte (descriptors), with the given flags.
func pullHead(flags uint8) raw {
	return rawHeader(TypePull).u64(1).u32(1).u64(8).u64(0).str("").str("").str("").u64(0).u8(flags).u32(0).u8(0)
}

func TestAbsurdCountsAndLengths(t *testing.T) {
	cases := []struct {
		name string
		b    raw
		dec  func([]byte) error
		want error
	}{
		{"want chunks 2^32-1", rawHeader(TypeWant).u64(1).u32(math.MaxUint32), decodeMessage, ErrTooLarge},
		{"want chunks limit+1", rawHeader(TypeWant).u64(1).u32(MaxChunks + 1).zeros(64), decodeMessage, ErrTooLarge},
		{"want chunks at limit, no bytes", rawHeader(TypeWant).u64(1).u32(MaxChunks).zeros(64), decodeMessage, ErrTruncated},
		{"grant credits 2^32-1", rawHeader(TypeGrant).u64(1).u32(math.MaxUint32), decodeMessage, ErrTooLarge},
		{"grant credits at limit, no bytes", rawHeader(TypeGrant).u64(1).u32(MaxCredits), decodeMessage, ErrTruncated},
		{"data runs 2^32-1", rawHeader(TypeData).u64(1).u32(0).u64(0).str("").u32(math.MaxUint32), decodeMessage, ErrTooLarge},
		{"data runs limit+1", rawHeader(TypeData).u64(1).u32(0).u64(0).str("").u32(MaxRuns + 1), decodeMessage, ErrTooLarge},
		{"data runs at limit, few bytes", rawHeader(TypeData).u64(1).u32(0).u64(0).str("").u32(MaxRuns).zeros(1000), decodeMessage, ErrTruncated},
		{"want endpoint 65535", rawHeader(TypeWant).u64(1).u32(0).u16(math.MaxUint16).zeros(70000), decodeMessage, ErrTooLarge},
		{"want traceparent limit+1", rawHeader(TypeWant).u64(1).u32(0).str("").u16(MaxString + 1).zeros(MaxString + 1), decodeMessage, ErrTooLarge},
		{"nack reason limit+1", rawHeader(TypeNack).u64(1).u32(0).u16(1).u16(MaxString + 1).zeros(MaxString + 1), decodeMessage, ErrTooLarge},
		{"handshake kind 65535", rawHeader(typeHandshake).u16(1).u16(math.MaxUint16), decodeHandshake, ErrTooLarge},
		{"agent engine 2^32-1", rawHeader(typeAgentDesc).str("n").u32(math.MaxUint32), decodeAgentDesc, ErrTooLarge},
		{"agent engine limit+1", rawHeader(typeAgentDesc).str("n").u32(MaxEngineMetadata + 1), decodeAgentDesc, ErrTooLarge},
		{"agent handshake 2^32-1", rawHeader(typeAgentDesc).str("n").u32(0).zeros(32).u8(1).u32(math.MaxUint32), decodeAgentDesc, ErrTooLarge},
	}
	for _, c := range cases {
		wantErr(t, c.name, c.dec(c.b), c.want)
		// Rejected before allocating anything in proportion to the claim.
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 10 {
			_ = c.dec(c.b)
		}
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
			t.Fatalf("%s: 10 rejections allocated %d bytes", c.name, grew)
		}
	}
}

func TestTrailingBytes(t *testing.T) {
	for _, e := range sampleEncodings() {
		for _, extra := range [][]byte{{0}, []byte("junk")} {
			wantErr(t, e.name+" + trailing", e.decode(append(bytes.Clone(e.b), extra...)), ErrTrailing)
		}
	}
	// Trailing bytes inside the embedded handshake are trailing too.
	hs := MarshalHandshake(sampleHandshakes()[0].h)
	b := rawHeader(typeAgentDesc).str("n").u32(0).zeros(32).u8(1).u32(uint32(len(hs) + 1))
	b = le.AppendUint32(append(append(b, hs...), 0), 0) // no pools
	d, err := UnmarshalAgentDesc(b)
	if err != nil {
		t.Fatalf("embedded handshake + trailing: %v; want the descriptor without its handshake", err)
	}
	wantErr(t, "embedded handshake + trailing", d.HandshakeErr, ErrTrailing)
}

func TestMalformedDecode(t *testing.T) {
	ack, _ := Marshal(&Ack{})
	flagged := bytes.Clone(ack)
	flagged[7] = 1
	hsFlagged := MarshalHandshake(sampleHandshakes()[0].h)
	hsFlagged[7] = 0x80

	single := func(r raw, off, addr, n uint64) raw { return r.u8(runSingle).u64(off).u64(addr).u64(n) }
	strided := func(r raw, run transfer.Run) raw {
		return r.u8(runStrided).u64(run.RegionOff).u64(run.Addr).u64(run.Len).u64(run.Count).u64(run.RegionStride).u64(run.AddrStride)
	}
	dataHead := func(n uint32) raw { return rawHeader(TypeData).u64(1).u32(0).u64(0).str("").u32(n) }
	creditKind := func(region, addr, n uint64, chunk uint32, dev int32, kind uint8) raw {
		return rawHeader(TypeGrant).u64(1).u32(1).u64(region).u64(addr).u64(n).u32(chunk).u32(uint32(dev)).u8(kind)
	}
	credit := func(region, addr, n uint64, chunk uint32, dev int32) raw {
		return creditKind(region, addr, n, chunk, dev, 0)
	}
	hs := func(v uint16, kind string, arena, chunk uint64, ep string) raw {
		return rawHeader(typeHandshake).u16(v).str(kind).u64(arena).u64(chunk).str(ep)
	}
	cases := []struct {
		name  string
		b     raw
		dec   func([]byte) error
		field string // the error must name it
	}{
		{"reserved flags", flagged, decodeMessage, "flags"},
		{"handshake reserved flags", hsFlagged, decodeHandshake, "flags"},
		{"want zero chunk", rawHeader(TypeWant).u64(1).u32(2).u64(5).u64(0).str("").str(""), decodeMessage, "chunk_bytes[1]"},
		{"grant no credits", rawHeader(TypeGrant).u64(1).u32(0), decodeMessage, "no credits"},
		{"credit len 0", credit(0, 0x1000, 0, 0, 0), decodeMessage, "credits[0]: len 0"},
		{"credit addr overflow", credit(0, math.MaxUint64, 2, 0, 0), decodeMessage, "overflows"},
		{"credit region overflow", credit(math.MaxUint64, 0, 2, 0, 0), decodeMessage, "overflows"},
		{"credit negative device", credit(0, 0, 2, 0, -1), decodeMessage, "negative device"},
		{"credit unknown memory kind", creditKind(0, 0, 2, 0, 0, 9), decodeMessage, "unknown memory kind 9"},
		{"data no pieces", dataHead(0).u64(3).u64(0), decodeMessage, "piece count 0"},
		{"data piece overflow", dataHead(0).u64(math.MaxUint64).u64(1), decodeMessage, "overflow"},
		{"want cancel with blocks", rawHeader(TypeWant).u64(1).u32(0).str("").str("").str("").u8(1), decodeMessage, "a cancel carries no blocks"},
		{"want blocks no ids", rawHeader(TypeWant).u64(1).u32(1).u64(1).str("").str("").str("").u8(1).str("kv").u64(8).u64(1).u32(0), decodeMessage, "no block ids"},
		{"want blocks bad pool name", rawHeader(TypeWant).u64(1).u32(1).u64(1).str("").str("").str("").u8(1).str("k\x01v").u64(8).u64(1).u32(1).u32(0), decodeMessage, "pool name"},
		{"agent pool stride short", rawHeader(typeAgentDesc).str("n").u32(0).zeros(32).u8(0).u32(1).str("kv").u8(0).u32(0).u64(8).u64(4).u64(1).u32(1).u64(0x1000).u8(0), decodeAgentDesc, "stride"},
		{"agent pool layout byte", rawHeader(typeAgentDesc).str("n").u32(0).zeros(32).u8(0).u32(1).str("kv").u8(0).u32(0).u64(8).u64(8).u64(1).u32(1).u64(0x1000).u8(2), decodeAgentDesc, "has-layout byte 2"},
		{"agent pool layout regions", rawHeader(typeAgentDesc).str("n").u32(0).zeros(32).u8(0).u32(1).str("kv").u8(0).u32(0).u64(8).u64(8).u64(1).u32(1).u64(0x1000).u8(1).u32(1).u32(2).u32(1).u32(0).u32(4).u32(1).u32(2).u8(1), decodeAgentDesc, "needs 2 regions"},
		{"agent pool layout block", rawHeader(typeAgentDesc).str("n").u32(0).zeros(32).u8(0).u32(1).str("kv").u8(0).u32(0).u64(8).u64(8).u64(1).u32(1).u64(0x1000).u8(1).u32(1).u32(1).u32(1).u32(0).u32(4).u32(1).u32(4).u8(1), decodeAgentDesc, "layout block is 16 bytes"},
		{"agent pool layout order", rawHeader(typeAgentDesc).str("n").u32(0).zeros(32).u8(0).u32(1).str("kv").u8(0).u32(0).u64(8).u64(8).u64(1).u32(1).u64(0x1000).u8(1).u32(1).u32(1).u32(1).u32(0).u32(4).u32(1).u32(2).u8(3), decodeAgentDesc, "order"},
		{"want shaped overlap", rawHeader(TypeWant).u64(1).u32(1).u64(1).str("").str("").str("").u8(2).str("kv").u64(8).u64(1).u32(1).u32(0).u32(1).u32(2).u32(0).u32(0).u32(4).u32(0).u32(2).u32(4), decodeMessage, "overlap"},
		{"want shaped past block", rawHeader(TypeWant).u64(1).u32(1).u64(1).str("").str("").str("").u8(2).str("kv").u64(8).u64(1).u32(1).u32(0).u32(1).u32(1).u32(0).u32(6).u32(4), decodeMessage, "passes the block"},
		{"want shaped group", rawHeader(TypeWant).u64(1).u32(1).u64(1).str("").str("").str("").u8(2).str("kv").u64(8).u64(1).u32(3).u32(0).u32(1).u32(2).u32(2).u32(1).u32(0).u32(0).u32(4), decodeMessage, "not whole groups of 2"},
		{"want shaped units", rawHeader(TypeWant).u64(1).u32(1).u64(1).str("").str("").str("").u8(2).str("kv").u64(8).u64(3).u32(4).u32(0).u32(1).u32(2).u32(3).u32(2).u32(1).u32(0).u32(0).u32(4), decodeMessage, "not a positive multiple of 2 groups"},
		{"want form 3", rawHeader(TypeWant).u64(1).u32(1).u64(1).str("").str("").str("").u8(3), decodeMessage, "form 3"},
		{"agent pool name twice", rawHeader(typeAgentDesc).str("n").u32(0).zeros(32).u8(0).u32(2).str("kv").u8(0).u32(0).u64(8).u64(8).u64(1).u32(1).u64(0x1000).u8(0).str("kv").u8(0).u32(0).u64(8).u64(8).u64(1).u32(1).u64(0x2000).u8(0), decodeAgentDesc, "twice"},
		{"run len 0", single(dataHead(1), 0, 0x1000, 0), decodeMessage, "runs[0]: len 0"},
		{"run count 0", strided(single(dataHead(2), 0, 0, 1), transfer.Run{Len: 8, Count: 0, RegionStride: 8}), decodeMessage, "runs[1]: count 0"},
		{"run unknown tag", dataHead(1).u8(7).zeros(48), decodeMessage, "unknown tag 7"},
		{"run non-canonical", strided(dataHead(1), transfer.Run{Len: 8, Count: 1}), decodeMessage, "non-canonical"},
		{"run region overflow", strided(dataHead(1), transfer.Run{RegionOff: 1, Len: 8, Count: 3, RegionStride: math.MaxUint64 / 2}), decodeMessage, "region span overflows"},
		{"run addr overflow", single(dataHead(1), 0, math.MaxUint64-3, 8), decodeMessage, "address span overflows"},
		{"nack code 0", rawHeader(TypeNack).u64(1).u32(0).u16(0).str("why"), decodeMessage, "code 0"},
		{"pull flags 2", pullHead(2).u32(1).u32(1).u32(1).u64(8).u32(0).u8(0).u64(0x1000).u8(4).u32(0), decodeMessage, "flags 0x2"},
		{"pull descs group empty", pullHead(0).u32(2).u32(2).u32(0).u64(8).u32(0).u8(0).u64(0x1000).u8(4).u32(1).u64(8).u32(0).u8(0).u64(0x1000).u8(4).u32(0).u32(0), decodeMessage, "group 0 is empty"},
		{"pull descs groups short", pullHead(0).u32(2).u32(1).u32(1).u64(8).u32(0).u8(0).u64(0x1000).u8(4).u32(0).zeros(40), decodeMessage, "hold 1 descriptors, the count says 2"},
		{"pull descs group past count", pullHead(0).u32(1).u32(1).u32(2).u64(8).u32(0).u8(0).u64(0x1000).u8(4).u32(0).u32(8), decodeMessage, "group 0 holds 2 descriptors, 1 of the count are left"},
		{"pull descs more groups than descs", pullHead(0).u32(1).u32(2).u32(1).u64(8).u32(0).u8(0).u64(0x1000).u8(4).u32(0).zeros(40), decodeMessage, "2 descriptor groups for 1 descriptors"},
		{"pull descs width", pullHead(0).u32(1).u32(1).u32(1).u64(8).u32(0).u8(0).u64(0x1000).u8(2).u16(0), decodeMessage, "offset width 2, want 4 or 8"},
		{"pull descs offset overflow", pullHead(0).u32(1).u32(1).u32(1).u64(8).u32(0).u8(0).u64(math.MaxUint64 - 3).u8(8).u64(8), decodeMessage, "descriptor group 0: base 0xfffffffffffffffc + offset 0x8 overflows"},
		{"pull descs base not lowest", pullHead(0).u32(1).u32(1).u32(1).u64(8).u32(0).u8(0).u64(0x1000).u8(4).u32(8), decodeMessage, "base 0x1000 is not its lowest address"},
		{"pull descs wide offsets", pullHead(0).u32(1).u32(1).u32(1).u64(8).u32(0).u8(0).u64(0x1000).u8(8).u64(0), decodeMessage, "8-byte offsets where 4 hold them"},
		{"pull descs groups not maximal", pullHead(0).u32(2).u32(2).u32(1).u64(8).u32(0).u8(0).u64(0x1000).u8(4).u32(0).u32(1).u64(8).u32(0).u8(0).u64(0x2000).u8(4).u32(0), decodeMessage, "group 1 shares the previous group's length, device and kind"},
		{"pull descs len 0", pullHead(0).u32(1).u32(1).u32(1).u64(0).u32(0).u8(0).u64(0x1000).u8(4).u32(0), decodeMessage, "src[0]: len 0"},
		{"pull descs kind", pullHead(0).u32(1).u32(1).u32(1).u64(8).u32(0).u8(9).u64(0x1000).u8(4).u32(0), decodeMessage, "src[0]: unknown memory kind 9"},
		{"pull descs overflow", pullHead(0).u32(1).u32(1).u32(1).u64(8).u32(0).u8(0).u64(math.MaxUint64 - 3).u8(4).u32(0), decodeMessage, "overflows"},
		{"pull cancel read", rawHeader(TypePull).u64(1).u32(0).u64(0).str("").str("").str("").u64(0).u8(1).u32(0).u8(0).u32(0).u32(0), decodeMessage, "read flag"},
		{"staged src len 0", rawHeader(TypeStaged).u64(0x1000).u64(0).u32(0).u8(0), decodeMessage, "src: len 0"},
		{"staged src kind", rawHeader(TypeStaged).u64(0x1000).u64(8).u32(0).u8(9), decodeMessage, "src: unknown memory kind 9"},
		{"staged src device", rawHeader(TypeStaged).u64(0x1000).u64(8).u32(0xffffffff).u8(0), decodeMessage, "src: negative device"},
		{"staged data run len 0", single(rawHeader(TypeStaged).u64(0x1000).u64(8).u32(0).u8(0).u64(1).u32(0).u64(0).str("").u32(1), 0, 0x1000, 0), decodeMessage, "runs[0]: len 0"},
		{"handshake version 0", hs(0, "zmq", 2, 1, "e"), decodeHandshake, "version 0"},
		{"handshake no kind", hs(1, "", 2, 1, "e"), decodeHandshake, "empty control kind"},
		{"handshake no endpoint", hs(1, "zmq", 2, 1, ""), decodeHandshake, "empty endpoint"},
		{"handshake max chunk 0", hs(1, "zmq", 2, 0, "e"), decodeHandshake, "max chunk 0"},
		{"handshake chunk > arena", hs(1, "zmq", 2, 3, "e"), decodeHandshake, "exceeds arena capacity"},
		{"agent empty name", rawHeader(typeAgentDesc).str("").u32(0).zeros(32).u8(0).u32(0), decodeAgentDesc, "empty name"},
		{"agent has-handshake 2", rawHeader(typeAgentDesc).str("n").u32(0).zeros(32).u8(2), decodeAgentDesc, "has-handshake byte 2"},
	}
	for _, c := range cases {
		err := c.dec(c.b)
		wantErr(t, c.name, err, ErrMalformed)
		if !strings.Contains(err.Error(), c.field) {
			t.Fatalf("%s: error %q does not mention %q", c.name, err, c.field)
		}
	}
	// The embedded handshake is validated as well, naming where it sits.
	bad := hs(1, "zmq", 2, 3, "e")
	b := rawHeader(typeAgentDesc).str("n").u32(0).zeros(32).u8(1).u32(uint32(len(bad)))
	d, derr := UnmarshalAgentDesc(le.AppendUint32(append(b, bad...), 0))
	if derr != nil || d.Handshake != nil {
		t.Fatalf("agent desc bad handshake: %+v, %v; want the descriptor without its handshake", d, derr)
	}
	err := d.HandshakeErr
	wantErr(t, "agent desc bad handshake", err, ErrMalformed)
	if !strings.Contains(err.Error(), "AGENTDESC handshake") {
		t.Fatalf("error %q does not say the handshake is embedded", err)
	}
}

func TestMarshalRejectsWhatDecodeRejects(t *testing.T) {
	long := strings.Repeat("x", MaxString+1)
	cases := []struct {
		name string
		msg  Message
		want error
	}{
		{"nil want", (*Want)(nil), ErrMalformed},
		{"nil interface", nil, ErrMalformed},
		{"foreign type", foreign{}, ErrWrongType},
		{"want zero chunk", &Want{ChunkBytes: []uint64{1, 0}}, ErrMalformed},
		{"want long endpoint", &Want{Endpoint: long}, ErrTooLarge},
		{"want long traceparent", &Want{TraceParent: long}, ErrTooLarge},
		{"want too many chunks", &Want{ChunkBytes: make([]uint64, MaxChunks+1)}, ErrTooLarge},
		{"grant empty", &Grant{}, ErrMalformed},
		{"grant len 0", &Grant{Credits: []Credit{{Addr: 1}}}, ErrMalformed},
		{"grant negative device", &Grant{Credits: []Credit{{Len: 1, Device: -2}}}, ErrMalformed},
		{"grant unknown memory kind", &Grant{Credits: []Credit{{Len: 1, Kind: 2}}}, ErrMalformed},
		{"data empty", &Data{}, ErrMalformed},
		{"data count 0", &Data{Runs: []transfer.Run{{Len: 1}}}, ErrMalformed},
		{"data overflow", &Data{Runs: []transfer.Run{{Addr: math.MaxUint64, Len: 2, Count: 1}}}, ErrMalformed},
		{"data long traceparent", &Data{Runs: []transfer.Run{{Len: 1, Count: 1}}, TraceParent: long}, ErrTooLarge},
		{"nack code 0", &Nack{}, ErrMalformed},
		{"nack long reason", &Nack{Code: NackBadRuns, Reason: long}, ErrTooLarge},
		{"nil ack", (*Ack)(nil), ErrMalformed},
		{"pull cancel read", &Pull{Read: true}, ErrMalformed},
		{"nil staged", (*Staged)(nil), ErrMalformed},
		{"staged src len 0", &Staged{Data: Data{Runs: []transfer.Run{{Len: 1, Count: 1}}}}, ErrMalformed},
		{"staged no runs", &Staged{Src: transfer.Desc{Addr: 1, Len: 1}}, ErrMalformed},
		{"staged long traceparent", &Staged{Src: transfer.Desc{Addr: 1, Len: 1}, Data: Data{Runs: []transfer.Run{{Len: 1, Count: 1}}, TraceParent: long}}, ErrTooLarge},
	}
	for _, c := range cases {
		dst := []byte("keep")
		out, err := AppendMarshal(dst, c.msg)
		if !errors.Is(err, c.want) {
			t.Fatalf("%s: error %v, want %v", c.name, err, c.want)
		}
		if string(out) != "keep" {
			t.Fatalf("%s: dst changed to %q on error", c.name, out)
		}
	}
	// Exactly MaxChunks encodes and decodes.
	w := &Want{Request: 1, ChunkBytes: make([]uint64, MaxChunks)}
	for i := range w.ChunkBytes {
		w.ChunkBytes[i] = uint64(i + 1)
	}
	b, err := Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Unmarshal(b)
	if err != nil || len(m.(*Want).ChunkBytes) != MaxChunks || m.(*Want).ChunkBytes[MaxChunks-1] != MaxChunks {
		t.Fatalf("MaxChunks WANT: %v", err)
	}
}

type foreign struct{}

func (foreign) Type() Type { return TypeAck }

func TestInvalidHandshakeAndDescEncodeButDoNotDecode(t *testing.T) {
	long := strings.Repeat("k", 70000)
	cases := []struct {
		name string
		h    Handshake
		want error
	}{
		{"zero", Handshake{}, ErrMalformed},
		{"kind over limit", Handshake{Version: 1, ControlKind: strings.Repeat("k", MaxString+1), ArenaCapacity: 2, MaxChunk: 1, Endpoint: "e"}, ErrTooLarge},
		{"endpoint over 64KiB", Handshake{Version: 1, ControlKind: "zmq", ArenaCapacity: 2, MaxChunk: 1, Endpoint: long}, ErrTooLarge},
	}
	for _, c := range cases {
		if err := c.h.Validate(); !errors.Is(err, c.want) {
			t.Fatalf("%s: Validate = %v, want %v", c.name, err, c.want)
		}
		_, err := UnmarshalHandshake(MarshalHandshake(c.h))
		wantErr(t, c.name, err, c.want)
		// Inside a descriptor a bad handshake is reported on HandshakeErr
		// and the rest of the descriptor still decodes.
		d, err := UnmarshalAgentDesc(MarshalAgentDesc(AgentDesc{Name: "n", Handshake: &c.h}))
		if err != nil || d.Name != "n" || d.Handshake != nil {
			t.Fatalf("%s in desc: %+v, %v; want the descriptor without its handshake", c.name, d, err)
		}
		wantErr(t, c.name+" in desc", d.HandshakeErr, c.want)
		if err := (AgentDesc{Name: "n", Handshake: &c.h}).Validate(); !errors.Is(err, c.want) {
			t.Fatalf("%s: AgentDesc.Validate = %v", c.name, err)
		}
	}
	if err := (AgentDesc{}).Validate(); !errors.Is(err, ErrMalformed) {
		t.Fatalf("empty desc Validate = %v", err)
	}
	big := AgentDesc{Name: "n", Engine: make([]byte, MaxEngineMetadata+1)}
	if err := big.Validate(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("big engine Validate = %v", err)
	}
	enc := MarshalAgentDesc(big)
	if len(enc) > 64 {
		t.Fatalf("over-limit engine metadata was written out (%d bytes)", len(enc))
	}
	_, err := UnmarshalAgentDesc(enc)
	wantErr(t, "big engine", err, ErrTooLarge)
}

func TestTypeAndCodeStrings(t *testing.T) {
	want := map[Type]string{TypeWant: "WANT", TypeGrant: "GRANT", TypeData: "DATA", TypeAck: "ACK", TypeNack: "NACK", TypePull: "PULL", TypePullEnd: "PULL_END", TypeStaged: "STAGED", 10: "type(10)"}
	for typ, s := range want {
		if typ.String() != s {
			t.Fatalf("%d.String() = %q, want %q", typ, typ.String(), s)
		}
	}
	codes := []NackCode{NackBadRuns, NackUnknownFlow, NackBadEndpoint, NackShutdown, NackScatterFailed, NackChunkTooLarge, NackMalformed, NackConflictingWant, NackBadBlocks, NackForbidden}
	seen := map[string]bool{}
	for i, c := range codes {
		if c != NackCode(i+1) || seen[c.String()] || strings.HasPrefix(c.String(), "nack(") {
			t.Fatalf("code %d: %q", c, c)
		}
		seen[c.String()] = true
	}
	if NackCode(300).String() != "nack(300)" {
		t.Fatal(NackCode(300).String())
	}
}

func TestUnmarshalDataReusesRuns(t *testing.T) {
	msg := unmergedData(1024)
	b, err := Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	var d Data
	if err := UnmarshalData(b, &d); err != nil || !reflect.DeepEqual(&d, msg) {
		t.Fatalf("UnmarshalData: %v", err)
	}
	backing := &d.Runs[0]
	small, _ := Marshal(&Data{Request: 2, TraceParent: "other", Runs: []transfer.Run{{Len: 1, Count: 1}}})
	if err := UnmarshalData(small, &d); err != nil || len(d.Runs) != 1 || &d.Runs[0] != backing || d.Request != 2 || d.TraceParent != "other" {
		t.Fatalf("reuse: %+v, %v", d, err)
	}
	allocs := testing.AllocsPerRun(20, func() {
		if err := UnmarshalData(b, &d); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("UnmarshalData with a large enough Data allocated %v times", allocs)
	}
	allocs = testing.AllocsPerRun(20, func() {
		if _, err := Unmarshal(b); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 3 { // the *Data, its runs and its trace parent
		t.Fatalf("Unmarshal of DATA allocated %v times, want 3", allocs)
	}
	// An untraced DATA (empty trace field) costs nothing for the field.
	untraced := *msg
	untraced.TraceParent = ""
	ub, err := Marshal(&untraced)
	if err != nil {
		t.Fatal(err)
	}
	allocs = testing.AllocsPerRun(20, func() {
		if err := UnmarshalData(ub, &d); err != nil || d.TraceParent != "" {
			t.Fatalf("untraced: %q, %v", d.TraceParent, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("UnmarshalData of an untraced DATA allocated %v times", allocs)
	}
	allocs = testing.AllocsPerRun(20, func() {
		if _, err := Unmarshal(ub); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 2 { // the *Data and its runs
		t.Fatalf("Unmarshal of an untraced DATA allocated %v times, want 2", allocs)
	}
	allocs = testing.AllocsPerRun(20, func() {
		if _, err := AppendMarshal(b[:0], msg); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("AppendMarshal into a large enough buffer allocated %v times", allocs)
	}
}

// TestTagBounds: a caller tag over MaxTag is refused by the encoder and the
// decoder alike (ErrTooLarge); an empty tag decodes as nil.
func TestTagBounds(t *testing.T) {
	long := bytes.Repeat([]byte{'t'}, MaxTag+1)
	for _, m := range []Message{&Want{Request: 1, ChunkBytes: []uint64{1}, Tag: long}, &Done{Request: 1, Tag: long}} {
		if _, err := Marshal(m); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("%v with a %d-byte tag: %v, want ErrTooLarge", m.Type(), len(long), err)
		}
	}
	head := rawHeader(TypeWant).u64(1).u32(1).u64(4096).str("e").str("")
	if _, err := Unmarshal(head.u16(uint16(len(long))).zeros(len(long))); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("WANT with a %d-byte tag on the wire: %v, want ErrTooLarge", len(long), err)
	}
	m, err := Unmarshal(head.str("abc").u8(0).u64(0))
	if err != nil || string(m.(*Want).Tag) != "abc" {
		t.Fatalf("tagged WANT: %+v, %v", m, err)
	}
	m, err = Unmarshal(head.str("").u8(0).u64(0))
	if err != nil || m.(*Want).Tag != nil {
		t.Fatalf("untagged WANT: %+v, %v", m, err)
	}
}
