package wire

import (
	"fmt"
	"math"
)

// maxHandshakeLen bounds an embedded handshake: header, version, two
// maximal strings and two uint64s.
const maxHandshakeLen = headerLen + 2 + 2*(strPrefix+MaxString) + 2*8

// Handshake is the bounce capability an agent advertises in its descriptor.
// Peers engage bounce only when the versions, control kinds and MaxChunk
// agree; ArenaCapacity is the usable bytes of the advertiser's arena and
// Endpoint its control endpoint.
type Handshake struct {
	Version       uint16
	ControlKind   string
	ArenaCapacity uint64
	MaxChunk      uint64
	Endpoint      string
}

// Validate reports whether h can be advertised: a non-zero Version, a
// non-empty ControlKind and Endpoint of at most MaxString bytes, and
// 0 < MaxChunk <= ArenaCapacity. UnmarshalHandshake applies the same checks.
func (h Handshake) Validate() error { return h.validate("HANDSHAKE") }

func (h Handshake) validate(what string) error {
	switch {
	case h.Version == 0:
		return errorf(what, ErrMalformed, "version 0")
	case h.ControlKind == "":
		return errorf(what, ErrMalformed, "empty control kind")
	case h.Endpoint == "":
		return errorf(what, ErrMalformed, "empty endpoint")
	case h.MaxChunk == 0:
		return errorf(what, ErrMalformed, "max chunk 0")
	case h.MaxChunk > h.ArenaCapacity:
		return errorf(what, ErrMalformed, "max chunk %d exceeds arena capacity %d", h.MaxChunk, h.ArenaCapacity)
	}
	if err := checkStr(what, "control kind", h.ControlKind); err != nil {
		return err
	}
	return checkStr(what, "endpoint", h.Endpoint)
}

// MarshalHandshake encodes h. It never fails: a handshake that breaks
// Validate still encodes, and UnmarshalHandshake rejects it (a string over
// MaxString is written as its length alone and fails with ErrTooLarge).
// Call Validate first to catch such values at the source.
func MarshalHandshake(h Handshake) []byte {
	return appendHandshake(nil, h)
}

func appendHandshake(b []byte, h Handshake) []byte {
	b = appendHeader(b, typeHandshake)
	b = le.AppendUint16(b, h.Version)
	b = appendStr(b, h.ControlKind)
	b = le.AppendUint64(b, h.ArenaCapacity)
	b = le.AppendUint64(b, h.MaxChunk)
	return appendStr(b, h.Endpoint)
}

// UnmarshalHandshake decodes and validates a handshake.
func UnmarshalHandshake(b []byte) (Handshake, error) {
	if err := expectHeader(b, typeHandshake); err != nil {
		return Handshake{}, err
	}
	d := decoder{b: b, off: headerLen, what: "HANDSHAKE"}
	return d.handshake()
}

func (d *decoder) handshake() (Handshake, error) {
	var h Handshake
	h.Version = d.u16("version")
	h.ControlKind = d.str("control kind")
	h.ArenaCapacity = d.u64("arena capacity")
	h.MaxChunk = d.u64("max chunk")
	h.Endpoint = d.str("endpoint")
	if err := d.end(); err != nil {
		return Handshake{}, err
	}
	if err := h.validate(d.what); err != nil {
		return Handshake{}, err
	}
	return h, nil
}

// AgentDesc is the blob peers exchange to load each other: the agent's name,
// its engine's opaque metadata, its public key and its bounce handshake (nil
// when the agent offers no bounce path).
type AgentDesc struct {
	Name   string
	Engine []byte
	// PublicKey is the agent's X25519 public key (package security); all
	// zeros when the agent runs with security.mode off.
	PublicKey [32]byte
	Handshake *Handshake
	// HandshakeErr is set by UnmarshalAgentDesc when a handshake is present
	// but cannot be decoded (a newer wire version, say). The rest of the
	// descriptor is still usable: the peer is served on the direct path.
	// It is never encoded.
	HandshakeErr error
	// Pools are the block pools the agent registered (at most MaxPools,
	// names unique): peers address their blocks by id in block-table
	// requests.
	Pools []PoolDesc
}

// Validate reports whether d can be published: a non-empty Name of at most
// MaxString bytes, Engine of at most MaxEngineMetadata bytes and a valid
// Handshake if present. UnmarshalAgentDesc applies the same checks.
func (d AgentDesc) Validate() error {
	const what = "AGENTDESC"
	if d.Name == "" {
		return errorf(what, ErrMalformed, "empty name")
	}
	if err := checkStr(what, "name", d.Name); err != nil {
		return err
	}
	if len(d.Engine) > MaxEngineMetadata {
		return errorf(what, ErrTooLarge, "engine metadata is %d bytes, limit %d", len(d.Engine), MaxEngineMetadata)
	}
	if d.Handshake != nil {
		if err := d.Handshake.validate("AGENTDESC handshake"); err != nil {
			return err
		}
	}
	return checkPools(what, d.Pools)
}

// checkPools validates a descriptor's pools: at most MaxPools, each valid,
// names unique.
func checkPools(what string, pools []PoolDesc) error {
	if len(pools) > MaxPools {
		return errorf(what, ErrTooLarge, "%d pools, limit %d", len(pools), MaxPools)
	}
	for i := range pools {
		if err := pools[i].validate(what); err != nil {
			return err
		}
		for j := range i {
			if pools[j].Name == pools[i].Name {
				return errorf(what, ErrMalformed, "pool name %q twice", pools[i].Name)
			}
		}
	}
	return nil
}

// MarshalAgentDesc encodes d. Like MarshalHandshake it never fails; values
// that break Validate encode but are rejected by UnmarshalAgentDesc.
func MarshalAgentDesc(d AgentDesc) []byte {
	n := headerLen + strPrefix + len(d.Name) + 4 + len(d.Engine) + len(d.PublicKey) + 1
	if d.Handshake != nil {
		n += 4 + headerLen + 2 + 2*strPrefix + len(d.Handshake.ControlKind) + len(d.Handshake.Endpoint) + 16
	}
	n += 4
	for i := range d.Pools {
		n += poolLen(&d.Pools[i])
	}
	b := make([]byte, 0, n)
	b = appendHeader(b, typeAgentDesc)
	b = appendStr(b, d.Name)
	if len(d.Engine) > MaxEngineMetadata {
		// Length alone: the decoder stops at it with ErrTooLarge.
		b = le.AppendUint32(b, uint32(min(uint64(len(d.Engine)), math.MaxUint32)))
	} else {
		b = le.AppendUint32(b, uint32(len(d.Engine)))
		b = append(b, d.Engine...)
	}
	b = append(b, d.PublicKey[:]...)
	if d.Handshake == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		lenAt := len(b)
		b = le.AppendUint32(b, 0)
		b = appendHandshake(b, *d.Handshake)
		le.PutUint32(b[lenAt:], uint32(len(b)-lenAt-4))
	}
	b = le.AppendUint32(b, uint32(min(len(d.Pools), math.MaxUint32)))
	for i := range d.Pools {
		b = appendPool(b, &d.Pools[i])
	}
	return b
}

// UnmarshalAgentDesc decodes and validates an agent descriptor. Engine is a
// copy (nil when empty); the result shares no memory with b.
func UnmarshalAgentDesc(b []byte) (AgentDesc, error) {
	if err := expectHeader(b, typeAgentDesc); err != nil {
		return AgentDesc{}, err
	}
	d := decoder{b: b, off: headerLen, what: "AGENTDESC"}
	var out AgentDesc
	out.Name = d.str("name")
	if eng := d.bytes("engine metadata", uint64(d.u32("engine metadata length")), MaxEngineMetadata); len(eng) > 0 {
		out.Engine = append([]byte(nil), eng...)
	}
	if k := d.bytes("public key", uint64(len(out.PublicKey)), len(out.PublicKey)); d.err == nil {
		copy(out.PublicKey[:], k)
	}
	switch has := d.u8("has handshake"); {
	case d.err != nil:
	case has == 1:
		hb := d.bytes("handshake", uint64(d.u32("handshake length")), maxHandshakeLen)
		if d.err != nil {
			break
		}
		if err := expectHeader(hb, typeHandshake); err != nil {
			out.HandshakeErr = fmt.Errorf("wire: AGENTDESC: handshake: %w", err)
			break
		}
		sub := decoder{b: hb, off: headerLen, what: "AGENTDESC handshake"}
		h, err := sub.handshake()
		if err != nil {
			out.HandshakeErr = err
			break
		}
		out.Handshake = &h
	case has != 0:
		return AgentDesc{}, errorf(d.what, ErrMalformed, "has-handshake byte %d, want 0 or 1", has)
	}
	if n := d.count("pool count", MaxPools, strPrefix+poolFixed); n > 0 {
		out.Pools = make([]PoolDesc, 0, n)
		for i := range n {
			p, ok := d.pool(i)
			if !ok {
				break
			}
			out.Pools = append(out.Pools, p)
		}
		if d.err == nil {
			d.err = checkPools(d.what, out.Pools)
		}
	}
	if err := d.end(); err != nil {
		return AgentDesc{}, err
	}
	if out.Name == "" {
		return AgentDesc{}, errorf(d.what, ErrMalformed, "empty name")
	}
	return out, nil
}

func appendHeader(b []byte, t Type) []byte {
	b = le.AppendUint32(b, magic)
	b = le.AppendUint16(b, Version)
	return append(b, byte(t), 0)
}

// appendStr appends a length-prefixed string; one over MaxString is written
// as its (clamped) length alone so that decoding fails with ErrTooLarge.
func appendStr(b []byte, s string) []byte {
	if len(s) > MaxString {
		return le.AppendUint16(b, uint16(min(len(s), math.MaxUint16)))
	}
	b = le.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}
