package wire

import (
	"errors"
	"fmt"
	"math"

	"github.com/bouncekv/bounce/transfer"
)

// Version is the codec version written in every header. Decoders reject any
// other version with ErrBadVersion. Version 2 added the agent's public key
// to the descriptor (authenticated peers); version 3 added the memory kind
// of the receiver's arena to every GRANT credit and the receiver's scatter
// time to every ACK; version 4 added the block-table form: the pools in the
// agent descriptor, the WANT's form byte (and its WantBlocks) and the
// DATA's piece range; version 5 added the trace context to DONE (the
// receiver's span of a direct-path request joins the sender's trace); version
// 6 added a pool's KV layout to its descriptor and the shaped WANT (a layout
// conversion's destination shape, its DATAs naming unit ranges) and the pull
// messages (PULL, PULL_END, STAGED: pull.go); version 7 made a descriptor
// PULL carry the holder's sources alone, grouped (its DATAs name piece
// ranges, which the puller scatters by its own plan). Peers of another
// version are refused with an error saying so.
const Version uint16 = 7

// Limits enforced by encoders and decoders. A count or length above its limit
// is ErrTooLarge, checked before anything is allocated.
const (
	// MaxString is the longest string field in bytes (endpoints, trace
	// parents, reasons, names, control kinds).
	MaxString = 4096
	// MaxChunks is the most chunk sizes one WANT may carry.
	MaxChunks = 1 << 22
	// MaxCredits is the most credits one GRANT may carry.
	MaxCredits = 1 << 22
	// MaxRuns is the most scatter runs one DATA may carry.
	MaxRuns = 1 << 24
	// MaxEngineMetadata is the largest engine metadata blob in an agent
	// descriptor, in bytes.
	MaxEngineMetadata = 64 << 20
	// MaxTag is the longest caller tag (Want.Tag, Done.Tag) in bytes.
	MaxTag = 256
)

// WholeRequest is the Nack chunk value for a refusal that concerns the whole
// request rather than one chunk.
const WholeRequest uint32 = math.MaxUint32

// Sentinel errors. Every decoding or encoding error wraps exactly one of them,
// with the message kind and field that failed.
var (
	// ErrTruncated means the input ends before the encoding does.
	ErrTruncated = errors.New("truncated")
	// ErrBadMagic means the input does not start with the bounce magic.
	ErrBadMagic = errors.New("bad magic")
	// ErrBadVersion means the header carries a codec version other than Version.
	ErrBadVersion = errors.New("unsupported version")
	// ErrWrongType means the header names a kind this decoder does not decode,
	// for example handshake bytes given to Unmarshal.
	ErrWrongType = errors.New("wrong type")
	// ErrTooLarge means a count or length exceeds the codec's limits.
	ErrTooLarge = errors.New("too large")
	// ErrTrailing means bytes follow a complete encoding.
	ErrTrailing = errors.New("trailing bytes")
	// ErrMalformed means a field breaks an invariant of its message, for
	// example a run with Count 0 or a non-zero reserved flag.
	ErrMalformed = errors.New("malformed")
)

// Type identifies a control message kind.
type Type uint8

// Control message kinds.
const (
	// TypeWant asks a receiver for credits (sender → receiver).
	TypeWant Type = 1 + iota
	// TypeGrant hands credits to a sender (receiver → sender).
	TypeGrant
	// TypeData reports a written chunk and its scatter plan (sender → receiver).
	TypeData
	// TypeAck reports a chunk scattered and its region free (receiver → sender).
	TypeAck
	// TypeNack refuses a request or chunk with a reason (receiver → sender).
	TypeNack
	// TypeDone reports a direct-path request ended (sender → receiver).
	TypeDone
	// TypePull asks the holder of a request's sources to send it, with the
	// puller's first credits (puller → holder; pull.go).
	TypePull
	// TypePullEnd ends a pull on the holder's side with a reason (holder →
	// puller).
	TypePullEnd
	// TypeStaged offers a pull's chunk staged in the holder's memory for the
	// puller to read, with the chunk's DATA (holder → puller; pull.go).
	TypeStaged

	// The two non-message kinds share the header, so decoding one as another
	// fails with ErrWrongType.
	typeHandshake Type = 'H'
	typeAgentDesc Type = 'A'
)

// String names the type ("WANT", "GRANT", ...).
func (t Type) String() string {
	switch t {
	case TypeWant:
		return "WANT"
	case TypeGrant:
		return "GRANT"
	case TypeData:
		return "DATA"
	case TypeAck:
		return "ACK"
	case TypeNack:
		return "NACK"
	case TypeDone:
		return "DONE"
	case TypePull:
		return "PULL"
	case TypePullEnd:
		return "PULL_END"
	case TypeStaged:
		return "STAGED"
	case typeHandshake:
		return "HANDSHAKE"
	case typeAgentDesc:
		return "AGENTDESC"
	default:
		return fmt.Sprintf("type(%d)", uint8(t))
	}
}

// Message is one control message: *Want, *Grant, *Data, *Ack, *Nack,
// *Done, *Pull, *PullEnd or *Staged.
type Message interface {
	Type() Type
}

// Want asks the receiver for one credit per chunk, in chunk order. An empty
// ChunkBytes is a cancel: the receiver drops the flow and reclaims every
// region it granted to it. A sender sends one WANT per request: while the
// request's flow is live on the receiver, a repeat with the same chunk list
// is dropped (and counted), and one with a different list is refused with
// NackConflictingWant, leaving the flow as it was. Endpoint is the sender's
// control endpoint, so the receiver can reach it back. TraceParent is the
// trace field: W3C trace context (a traceparent, optionally followed by a
// newline and a tracestate), opaque to the codec and empty when the sender
// does not trace; every encoder of this version writes it (a length-prefixed
// string), so there is no older form to accept. Chunk sizes must be
// positive. Tag is the caller's opaque tag for the request (at most MaxTag
// bytes), handed to the receiver's completion event; like the trace field
// it is optional in value (empty when the caller set none) but always
// encoded, as a uint16 length and the bytes. Blocks, when set, makes the
// request a block-table one (see WantBlocks): its DATAs carry piece ranges
// instead of runs. A cancel carries no Blocks.
type Want struct {
	Request     uint64
	ChunkBytes  []uint64
	Endpoint    string
	TraceParent string
	Tag         []byte
	Blocks      *WantBlocks
	// Incarnation is the sending agent's incarnation, random per agent
	// (per process): a receiver that fenced a lost sender admits the same
	// name again at once under a new incarnation, while the old one's late
	// WANTs stay dropped. Zero means unknown: such a sender is fenced by
	// name, as before incarnations.
	Incarnation uint64
}

// Type returns TypeWant.
func (*Want) Type() Type { return TypeWant }

// IsCancel reports whether w cancels its request (no chunk sizes).
func (w *Want) IsCancel() bool { return len(w.ChunkBytes) == 0 }

// Credit is exclusive permission to write Len bytes at Addr on the receiver's
// Device, for chunk Chunk. Kind is the memory kind of the receiver's arena,
// so the sender labels its write with what it actually writes into. Region is
// the receiver's handle for the region (its arena offset); the sender echoes
// it in DATA. Len must be positive, Addr+Len and Region+Len must not
// overflow, Device must not be negative and Kind must be a known MemKind
// (host or cuda).
type Credit struct {
	Chunk  uint32
	Region uint64
	Addr   uint64
	Len    uint64
	Device int32
	Kind   transfer.MemKind
}

// Grant hands one or more credits (at least one) for a request to its sender.
type Grant struct {
	Request uint64
	Credits []Credit
}

// Type returns TypeGrant.
func (*Grant) Type() Type { return TypeGrant }

// Data tells the receiver that chunk Chunk of a request landed in region
// Region, with the scatter runs (region offsets relative to the region) that
// place it. It carries at least one run; each run must have positive Len and
// Count and spans that do not overflow. A block-table request's DATA
// carries no runs but Pieces instead, the piece range of its WANT's blocks
// the region holds (encoded as a run count of 0 followed by the range).
// TraceParent is the trace field, as in Want (the sender's chunk span);
// decoding an empty one allocates nothing.
type Data struct {
	Request     uint64
	Chunk       uint32
	Region      uint64
	Runs        []transfer.Run
	Pieces      PieceRange
	TraceParent string
}

// IsBlocks reports whether d is in the block-table form (a piece range).
func (d *Data) IsBlocks() bool { return len(d.Runs) == 0 && d.Pieces.Count > 0 }

// Type returns TypeData.
func (*Data) Type() Type { return TypeData }

// Ack tells the sender that chunk Chunk was scattered and region Region is
// free again. ScatterNS is the receiver's time from the DATA's arrival to
// the scatter's end, in nanoseconds (the scatter stage of the sender's
// per-stage times; the sender caps it at its own DATA→ACK time).
type Ack struct {
	Request   uint64
	Chunk     uint32
	Region    uint64
	ScatterNS uint64
}

// Type returns TypeAck.
func (*Ack) Type() Type { return TypeAck }

// NackCode says why a receiver refused.
type NackCode uint16

// Refusal reasons. Code 0 is invalid on the wire; codes this version does not
// name still decode, so a newer peer's reasons reach the sender.
const (
	// NackBadRuns: DATA runs fall outside the granted region or cannot be
	// scattered.
	NackBadRuns NackCode = 1 + iota
	// NackUnknownFlow: the request or region is not one the receiver holds
	// for this peer (e.g. a DATA that raced a cancel).
	NackUnknownFlow
	// NackBadEndpoint: the WANT's endpoint could not be registered.
	NackBadEndpoint
	// NackShutdown: the receiver is shutting down.
	NackShutdown
	// NackScatterFailed: the scatter failed; the bytes did not land.
	NackScatterFailed
	// NackChunkTooLarge: a chunk can never fit the receiver's arena.
	NackChunkTooLarge
	// NackMalformed: the message could not be decoded.
	NackMalformed
	// NackConflictingWant: a WANT named a request whose flow is live with a
	// different chunk list. A flow is wanted once; the receiver leaves the
	// live flow as it was.
	NackConflictingWant
	// NackBadBlocks: a block-table WANT names no pool of the receiver's, or
	// a pool of another block length or region count, one the sender may
	// not write, an id out of range or a destination id twice; or a DATA's
	// piece range falls outside its request or its region.
	NackBadBlocks
	// NackForbidden: DATA runs write memory the sender may not write (the
	// arena, memory registered for other peers, unregistered memory).
	NackForbidden
)

// String names the code ("bad-runs", ...).
func (c NackCode) String() string {
	switch c {
	case NackBadRuns:
		return "bad-runs"
	case NackUnknownFlow:
		return "unknown-flow"
	case NackBadEndpoint:
		return "bad-endpoint"
	case NackShutdown:
		return "shutdown"
	case NackScatterFailed:
		return "scatter-failed"
	case NackChunkTooLarge:
		return "chunk-too-large"
	case NackMalformed:
		return "malformed"
	case NackConflictingWant:
		return "conflicting-want"
	case NackBadBlocks:
		return "bad-blocks"
	case NackForbidden:
		return "forbidden"
	case NackGaveUp:
		return "gave-up"
	default:
		return fmt.Sprintf("nack(%d)", uint16(c))
	}
}

// Nack refuses a request (Chunk = WholeRequest) or one chunk of it, with a
// code the sender can act on and a human-readable reason.
type Nack struct {
	Request uint64
	Chunk   uint32
	Code    NackCode
	Reason  string
}

// Type returns TypeNack.
func (*Nack) Type() Type { return TypeNack }

// Done tells the receiver that a direct-path request (one the sender posted
// straight to the receiver's memory, without credits) ended: Bytes landed
// when Reason is empty, or it failed for Reason. The sender sends it once
// its engine op is terminal, so a successful Done follows the last byte.
// Tag is the caller's tag (at most MaxTag bytes, may be empty); Endpoint is
// the sender's control endpoint, as in Want; TraceParent is the sender's
// trace context of the request, as in Want (empty when untraced).
type Done struct {
	Request     uint64
	Bytes       uint64
	Endpoint    string
	Reason      string
	TraceParent string
	Tag         []byte
}

// Type returns TypeDone.
func (*Done) Type() Type { return TypeDone }
