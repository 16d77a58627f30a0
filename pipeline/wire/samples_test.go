package wire

import (
	"math"
	"strings"

	"github.com/bouncekv/bounce/transfer"
)

const testTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// testTraceContext is a trace field holding a tracestate after the
// traceparent, the way the pipeline's carrier writes one.
const testTraceContext = testTraceParent + "\nrojo=00f067aa0ba902b7,congo=t61rcWkgMzE"

type namedMessage struct {
	name string
	msg  Message
}

// sampleMessages covers every type with empty, typical and maximal fields.
func sampleMessages() []namedMessage {
	long := strings.Repeat("e", MaxString)
	return []namedMessage{
		{"want-cancel-empty", &Want{}},
		{"want-cancel-endpoint", &Want{Request: 7, Endpoint: "tcp://10.0.0.2:41000"}},
		{"want-typical", &Want{Request: 42, ChunkBytes: []uint64{32 << 20, 32 << 20, 4096}, Endpoint: "tcp://10.0.0.2:41000", TraceParent: testTraceParent}},
		{"want-traced-state", &Want{Request: 43, ChunkBytes: []uint64{8 << 20}, Endpoint: "tcp://10.0.0.2:41000", TraceParent: testTraceContext}},
		{"want-max", &Want{Request: math.MaxUint64, ChunkBytes: []uint64{math.MaxUint64, 1}, Endpoint: long, TraceParent: long}},
		{"want-tagged", &Want{Request: 44, ChunkBytes: []uint64{8 << 20}, Endpoint: "tcp://10.0.0.2:41000", Tag: []byte("req-7f3a\x00\xff")}},
		{"want-tag-max", &Want{Request: 45, ChunkBytes: []uint64{1}, Tag: []byte(strings.Repeat("t", MaxTag))}},
		{"want-blocks", &Want{Request: 46, ChunkBytes: []uint64{8 << 20, 4096}, Endpoint: "tcp://10.0.0.2:41000", Blocks: &WantBlocks{Pool: "kv-l0..79", BlockLen: 4096, Pieces: 6, IDs: []uint32{7, 0, math.MaxUint32}}}},
		{"want-incarnation", &Want{Request: 47, ChunkBytes: []uint64{4096}, Endpoint: "tcp://10.0.0.2:41000", Incarnation: 0x9e3779b97f4a7c15}},
		{"want-shaped", &Want{Request: 49, ChunkBytes: []uint64{8192}, Blocks: &WantBlocks{Pool: "kv", BlockLen: 8192, Pieces: 4, IDs: []uint32{9, 2},
			Shape: &transfer.Shape{Group: 1, Segs: []transfer.Segment{{Off: 256, Len: 256}, {Off: 768, Len: 256}}}}}},
		{"want-shaped-group", &Want{Request: 50, ChunkBytes: []uint64{8192}, Blocks: &WantBlocks{Pool: "kv", BlockLen: 4096, Pieces: 2, IDs: []uint32{4, 5},
			Shape: &transfer.Shape{Group: 2, Segs: []transfer.Segment{{Block: 1, Off: 0, Len: 4096}, {Block: 0, Off: 0, Len: 4096}}}}}},
		{"want-blocks-incarnation", &Want{Request: 48, ChunkBytes: []uint64{4096}, Blocks: &WantBlocks{Pool: "kv", BlockLen: 4096, Pieces: 1, IDs: []uint32{3}}, Incarnation: 7}},
		{"grant-one", &Grant{Request: 1, Credits: []Credit{{Chunk: 0, Region: 0, Addr: 0x7f0000000000, Len: 1 << 20, Device: 0}}}},
		{"grant-max", &Grant{Request: math.MaxUint64, Credits: []Credit{
			{Chunk: math.MaxUint32, Region: math.MaxUint64 - 1, Addr: math.MaxUint64 - 1, Len: 1, Device: math.MaxInt32},
			{Chunk: 1, Region: 1 << 20, Addr: 0x1000, Len: 2 << 20, Device: 3, Kind: transfer.CUDA},
		}}},
		{"data-one-run", &Data{Request: 9, Chunk: 0, Region: 0, Runs: []transfer.Run{{RegionOff: 0, Addr: 0x1000, Len: 4096, Count: 1}}}},
		{"data-mixed", &Data{Request: 9, Chunk: 3, Region: 1 << 20, TraceParent: testTraceParent, Runs: []transfer.Run{
			{RegionOff: 0, Addr: 0x10000, Len: 4096, Count: 1},
			{RegionOff: 4096, Addr: 0x20000, Len: 4096, Count: 64, RegionStride: 4096, AddrStride: 16384},
			{RegionOff: 1 << 19, Addr: 0x90000, Len: 32, Count: 1, RegionStride: 7, AddrStride: 9},
			{RegionOff: 1 << 19, Addr: 0xa0000, Len: 8, Count: 3},
		}}},
		{"data-traced-state", &Data{Request: 43, Chunk: 0, Region: 8 << 20, TraceParent: testTraceContext, Runs: []transfer.Run{{RegionOff: 0, Addr: 0x1000, Len: 4096, Count: 1}}}},
		{"data-max", &Data{Request: math.MaxUint64, Chunk: math.MaxUint32, Region: math.MaxUint64, TraceParent: long, Runs: []transfer.Run{
			{RegionOff: math.MaxUint64 - 1, Addr: math.MaxUint64 - 1, Len: 1, Count: 1},
			{RegionOff: 0, Addr: 0, Len: 1, Count: math.MaxUint64},
		}}},
		{"data-blocks", &Data{Request: 46, Chunk: 1, Region: 8 << 20, Pieces: PieceRange{First: 2048, Count: 2048}}},
		{"data-blocks-max", &Data{Request: math.MaxUint64, Chunk: math.MaxUint32, Region: math.MaxUint64, TraceParent: testTraceParent, Pieces: PieceRange{First: math.MaxUint64 - 1, Count: 1}}},
		{"ack-zero", &Ack{}},
		{"ack-max", &Ack{Request: math.MaxUint64, Chunk: math.MaxUint32, Region: math.MaxUint64}},
		{"nack-empty-reason", &Nack{Request: 5, Chunk: WholeRequest, Code: NackShutdown}},
		{"nack-future-code", &Nack{Request: 5, Chunk: 2, Code: 999, Reason: "a code this version does not name"}},
		{"nack-max", &Nack{Request: math.MaxUint64, Chunk: math.MaxUint32, Code: math.MaxUint16, Reason: long}},
		{"done-zero", &Done{}},
		{"done-typical", &Done{Request: 12, Bytes: 320 << 20, Endpoint: "tcp://10.0.0.2:41000", Tag: []byte("kv-req-12")}},
		{"done-traced", &Done{Request: 14, Bytes: 4096, Endpoint: "tcp://10.0.0.2:41000", TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tag: []byte("kv-req-14")}},
		{"done-failed", &Done{Request: 13, Reason: "direct write failed: peer lost", Tag: []byte{1}}},
		{"done-max", &Done{Request: math.MaxUint64, Bytes: math.MaxUint64, Endpoint: long, Reason: long, TraceParent: long, Tag: []byte(strings.Repeat("t", MaxTag))}},
		{"pull-cancel", &Pull{Request: 3}},
		{"pull-blocks", &Pull{Request: 50, ChunkBytes: []uint64{8 << 20, 4096}, MinChunk: 1 << 20, Endpoint: "tcp://10.0.0.2:41000", TraceParent: testTraceParent,
			Tag: []byte("kv-req-50"), Incarnation: 9, Credits: []Credit{{Chunk: 0, Region: 0, Addr: 0x7f0000000000, Len: 8 << 20}},
			Blocks: &PullBlocks{SrcPool: "kv", SrcIDs: []uint32{7, 0, math.MaxUint32}}}},
		{"pull-descs", &Pull{Request: 51, ChunkBytes: []uint64{8192}, Src: []transfer.Desc{{Addr: 0x1000, Len: 4096}, {Addr: 0x3000, Len: 4096, Device: 1, Kind: transfer.CUDA}}}},
		{"pull-descs-groups", &Pull{Request: 54, ChunkBytes: []uint64{16384}, Src: []transfer.Desc{{Addr: 0x9000, Len: 4096}, {Addr: 0x1000, Len: 4096},
			{Addr: 0x20000, Len: 8192}, {Addr: 0x5000, Len: 4096}}}},
		{"pull-descs-wide", &Pull{Request: 55, ChunkBytes: []uint64{8192}, Src: []transfer.Desc{{Addr: 0x7f0000000000, Len: 4096}, {Addr: 0x1000, Len: 4096}, {Addr: math.MaxUint64 - 4096, Len: 4096}}}},
		{"pull-max", &Pull{Request: math.MaxUint64, ChunkBytes: []uint64{math.MaxUint64}, MinChunk: math.MaxUint64, Endpoint: long, TraceParent: long,
			Tag: []byte(strings.Repeat("t", MaxTag)), Incarnation: math.MaxUint64,
			Credits: []Credit{{Chunk: math.MaxUint32, Region: math.MaxUint64 - 1, Addr: math.MaxUint64 - 1, Len: 1, Device: math.MaxInt32, Kind: transfer.CUDA}},
			Blocks:  &PullBlocks{SrcPool: strings.Repeat("p", MaxPoolName), SrcIDs: []uint32{math.MaxUint32}}}},
		{"pull-read-descs", &Pull{Request: 52, ChunkBytes: []uint64{4096}, Src: []transfer.Desc{{Addr: 0x1000, Len: 4096}},
			Credits: []Credit{{Chunk: 0, Region: 1 << 20, Addr: 0x7f0000100000, Len: 4096}}, Read: true}},
		{"pull-read-blocks", &Pull{Request: 53, ChunkBytes: []uint64{8192}, Blocks: &PullBlocks{SrcPool: "kv", SrcIDs: []uint32{4, 1}}, Read: true}},
		{"staged-runs", &Staged{Src: transfer.Desc{Addr: 0x7f0000000000, Len: 8192}, Data: Data{Request: PullID(52), Chunk: 0, Region: 1 << 20, TraceParent: testTraceParent,
			Runs: []transfer.Run{{RegionOff: 0, Addr: 0x9000, Len: 4096, Count: 2, RegionStride: 4096, AddrStride: 8192}}}}},
		{"staged-blocks", &Staged{Src: transfer.Desc{Addr: 0x7f0000200000, Len: 8192}, Data: Data{Request: PullID(53), Chunk: 1, Region: 8 << 20, Pieces: PieceRange{First: 2, Count: 2}}}},
		{"staged-max", &Staged{Src: transfer.Desc{Addr: math.MaxUint64 - 1, Len: 1, Device: math.MaxInt32, Kind: transfer.CUDA}, Data: Data{Request: math.MaxUint64, Chunk: math.MaxUint32, Region: math.MaxUint64, TraceParent: long,
			Runs: []transfer.Run{{RegionOff: math.MaxUint64 - 1, Addr: math.MaxUint64 - 1, Len: 1, Count: 1}}}}},
		{"pull-end", &PullEnd{Request: 50, Code: NackForbidden, Reason: "pool \"kv\" is not registered for \"b\""}},
		{"pull-end-unproven", &PullEnd{Request: math.MaxUint64, Code: math.MaxUint16, Reason: long, Unproven: true}},
	}
}

type namedHandshake struct {
	name string
	h    Handshake
}

func sampleHandshakes() []namedHandshake {
	long := strings.Repeat("h", MaxString)
	return []namedHandshake{
		{"handshake-min", Handshake{Version: 1, ControlKind: "z", ArenaCapacity: 1, MaxChunk: 1, Endpoint: "e"}},
		{"handshake-typical", Handshake{Version: Version, ControlKind: "zmq", ArenaCapacity: 256 << 20, MaxChunk: 32 << 20, Endpoint: "tcp://10.0.0.1:5555"}},
		{"handshake-max", Handshake{Version: math.MaxUint16, ControlKind: long, ArenaCapacity: math.MaxUint64, MaxChunk: math.MaxUint64, Endpoint: long}},
	}
}

type namedAgentDesc struct {
	name string
	d    AgentDesc
}

func sampleAgentDescs() []namedAgentDesc {
	hs := sampleHandshakes()
	return []namedAgentDesc{
		{"agentdesc-no-bounce", AgentDesc{Name: "a"}},
		{"agentdesc-typical", AgentDesc{Name: "prefill-0", Engine: []byte("tcp engine metadata\x00\x01\x02"), PublicKey: [32]byte{1, 2, 3, 31: 0xff}, Handshake: &hs[1].h}},
		{"agentdesc-pools", AgentDesc{Name: "decode-3", Engine: []byte("md"), Handshake: &hs[1].h, Pools: []PoolDesc{
			{Name: "kv", Pool: transfer.Pool{Regions: []uint64{0x10000, 0x90000}, BlockLen: 4096, Stride: 4096, Blocks: 16}},
			{Name: "gpu0/kv", Pool: transfer.Pool{Regions: []uint64{0x7f0000000000, 0x7f0000000800}, BlockLen: 2048, Stride: 4096, Blocks: 1 << 20, Kind: transfer.CUDA, Device: 3}},
			{Name: "kv-nhd", Pool: transfer.Pool{Regions: []uint64{0x200000, 0x300000}, BlockLen: 4096, Stride: 4096, Blocks: 16},
				Layout: &transfer.Layout{Layers: 1, KV: 2, Heads: 1, FirstHead: 3, HeadDim: 128, Tokens: 16, Elem: 2, Order: transfer.NHD}},
		}}},
		{"agentdesc-max", AgentDesc{Name: strings.Repeat("n", MaxString), Engine: []byte(strings.Repeat("m", 1<<16)), Handshake: &hs[2].h}},
	}
}

// encoding is one valid encoded sample and the decoder it belongs to.
type encoding struct {
	name   string
	kind   string // "message", "handshake", "agentdesc"
	b      []byte
	decode func([]byte) error
}

func decodeMessage(b []byte) error   { _, err := Unmarshal(b); return err }
func decodeHandshake(b []byte) error { _, err := UnmarshalHandshake(b); return err }

// decodeAgentDesc reports a descriptor's error, or else its handshake's.
func decodeAgentDesc(b []byte) error {
	d, err := UnmarshalAgentDesc(b)
	if err != nil {
		return err
	}
	return d.HandshakeErr
}

// sampleEncodings returns every sample encoded.
func sampleEncodings() []encoding {
	var out []encoding
	for _, s := range sampleMessages() {
		b, err := Marshal(s.msg)
		if err != nil {
			panic(s.name + ": " + err.Error())
		}
		out = append(out, encoding{s.name, "message", b, decodeMessage})
	}
	for _, s := range sampleHandshakes() {
		out = append(out, encoding{s.name, "handshake", MarshalHandshake(s.h), decodeHandshake})
	}
	for _, s := range sampleAgentDescs() {
		out = append(out, encoding{s.name, "agentdesc", MarshalAgentDesc(s.d), decodeAgentDesc})
	}
	return out
}
