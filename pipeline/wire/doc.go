// Package wire is the little-endian codec for bounce's control plane: the
// control messages (WANT, GRANT, DATA, ACK, NACK, DONE and the pull's PULL,
// PULL_END and STAGED), the capability
// handshake and the agent descriptor peers exchange before they talk.
//
// It is pure logic: no goroutines, locks, clocks or IO. Decoders never panic
// and never allocate in proportion to a length or count they have not yet
// checked against the bytes actually present; every failure wraps exactly one
// of the sentinel errors (ErrTruncated, ErrBadMagic, ErrBadVersion,
// ErrWrongType, ErrTooLarge, ErrTrailing, ErrMalformed) with the field that
// caused it.
//
// # Layout
//
// Every encoding starts with the same 8-byte header:
//
//	offset 0  magic    4 bytes  "BNCE"
//	offset 4  version  uint16   Version
//	offset 6  type     uint8    TypeWant..TypeStaged, or the handshake or
//	                            agent descriptor kind
//	offset 7  flags    uint8    reserved, must be 0
//
// Integers are little-endian and unpadded. A string is a uint16 byte length
// followed by the bytes (at most MaxString). Bodies:
//
//	WANT   request u64 | n u32 | n × chunk_bytes u64 | endpoint str | traceparent str | tag |
//	       form u8 (0 descriptors, 1 blocks) | when 1: pool str | block_len u64 | pieces u64 |
//	       m u32 | m × block id u32
//	GRANT  request u64 | n u32 | n × credit (region u64, addr u64, len u64, chunk u32, device i32,
//	       kind u8: 0 host, 1 cuda)
//	DATA   request u64 | chunk u32 | region u64 | traceparent str | n u32 | n × run,
//	       or, when n is 0 (the block form), first_piece u64 | piece_count u64
//	ACK    request u64 | chunk u32 | region u64 | scatter_ns u64
//	NACK   request u64 | chunk u32 | code u16 | reason str
//	DONE   request u64 | bytes u64 | endpoint str | reason str | traceparent str | tag
//	PULL   request u64 | n u32 | n × chunk_bytes u64 | min_chunk u64 | endpoint str |
//	       traceparent str | tag | incarnation u64 | flags u8 (bit 0: the puller reads) |
//	       c u32 | c × credit | form u8 (0 descriptors, 1 blocks) | when 0: k u32 | k × src desc |
//	       k × dst desc; when 1: src_pool str | m u32 | m × block id u32
//	PULL_END request u64 | code u16 | flags u8 (bit 0: unproven) | reason str
//	STAGED src desc | a DATA body (request ... runs or piece range)
//
// A desc is addr u64 | len u64 | device i32 | kind u8 (21 bytes).
//
// A tag is the caller's opaque request tag: a uint16 length and at most
// MaxTag bytes (empty when the caller set none).
//
// A run is a one-byte tag and its fields. Tag 0 is a single copy (Count 1,
// no strides) and carries region_off, addr and len (25 bytes in all); tag 1
// carries all six fields of transfer.Run (49 bytes). The encoder uses tag 0
// whenever it is exact, so an unmerged plan costs about half of the full
// form, and the decoder rejects a tag 1 run that tag 0 could have carried:
// every value has exactly one encoding, so decode → encode reproduces the
// input bytes.
//
// The handshake body is version u16 | control_kind str | arena_capacity u64 |
// max_chunk u64 | endpoint str. The agent descriptor body is name str |
// engine (u32 length + bytes, at most MaxEngineMetadata) | public_key 32 bytes |
// has_handshake u8 (0 or 1) | when 1, a u32 length and a complete handshake
// encoding | p u32 | p × pool (name str | kind u8 | device i32 | block_len u64 |
// stride u64 | blocks u64 | r u32 | r × region base u64).
package wire
