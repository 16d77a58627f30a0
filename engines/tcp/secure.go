package tcp

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/flynn/noise"

	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

// Authenticated connections (Config.Peers enabled) start with a Noise
// handshake, Noise_IK_25519_AESGCM_SHA256, with the agents' X25519 keys
// (the same keys as the control plane's CURVE):
//
//	dialer → listener: authMagic, u16 length, IK message 1 (e, es, s, ss; payload: flags)
//	listener → dialer: u16 length, IK message 2 (e, ee, se; payload: flags)
//
// The dialer pins the listener's key from the peer's loaded descriptor;
// the listener learns the dialer's key from message 1 and refuses it unless
// it belongs to an admitted peer, and the HELLO that follows must name that
// peer. The HELLO (and every frame, when either side asked for encryption)
// travels in AES-GCM records keyed by the handshake, so a replayed message 1
// gets nowhere: only the holder of the dialer's ephemeral secret can write
// the HELLO. With encryption off, frames after the HELLO are plaintext (see
// docs/SECURITY.md for what that leaves an on-path attacker).
const (
	authMagic      = "BNZ1"
	noisePrologue  = "bounce tcp engine, noise v1"
	maxNoiseMsg    = 1024
	flagEncrypt    = 1
	recordOverhead = 16 // AES-GCM tag
	// maxRecord is the largest plaintext of one record: Noise transport
	// messages are at most 65535 bytes including the tag.
	maxRecord = 65535 - recordOverhead
)

// errUnauthenticated marks a connection that failed or skipped the
// handshake; it is closed without a reply.
var errUnauthenticated = errors.New("tcp: unauthenticated connection")

// noiseConfig is the handshake configuration of one connection. The
// static private key is a's: the handshake state holds a random stand-in,
// and every DH with the stand-in is computed by a (which may be the host
// of a plugin process), so the secret need not be in this process.
func noiseConfig(a transfer.Authenticator, initiator bool, peer security.Key) (noise.Config, error) {
	var stand [32]byte
	if _, err := rand.Read(stand[:]); err != nil {
		return noise.Config{}, fmt.Errorf("handshake: %w", err)
	}
	pub := a.PublicKey()
	c := noise.Config{
		CipherSuite:   noise.NewCipherSuite(staticDH{DHFunc: noise.DH25519, stand: stand, a: a}, noise.CipherAESGCM, noise.HashSHA256),
		Pattern:       noise.HandshakeIK,
		Initiator:     initiator,
		Prologue:      []byte(noisePrologue),
		StaticKeypair: noise.DHKey{Private: stand[:], Public: pub[:]},
	}
	if initiator {
		c.PeerStatic = append([]byte(nil), peer[:]...)
	}
	return c, nil
}

// staticDH is Noise's X25519 with the static private key replaced by a
// stand-in: a DH with the stand-in is the Authenticator's.
type staticDH struct {
	noise.DHFunc
	stand [32]byte
	a     transfer.Authenticator
}

// DH implements noise.DHFunc.
func (s staticDH) DH(priv, pub []byte) ([]byte, error) {
	if subtle.ConstantTimeCompare(priv, s.stand[:]) != 1 {
		return s.DHFunc.DH(priv, pub)
	}
	if len(pub) != 32 {
		return nil, fmt.Errorf("handshake: public key of %d bytes", len(pub))
	}
	out, err := s.a.DH([32]byte(pub))
	if err != nil {
		return nil, err
	}
	return out[:], nil
}

func writeNoiseMsg(conn net.Conn, prefix string, msg []byte) error {
	b := make([]byte, 0, len(prefix)+2+len(msg))
	b = append(b, prefix...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	_, err := conn.Write(append(b, msg...))
	return err
}

func readNoiseMsg(conn net.Conn) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(conn, l[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint16(l[:])
	if n == 0 || n > maxNoiseMsg {
		return nil, fmt.Errorf("handshake message of %d bytes (1..%d): %w", n, maxNoiseMsg, errUnauthenticated)
	}
	b := make([]byte, n)
	_, err := io.ReadFull(conn, b)
	return b, err
}

func (e *Engine) flags() byte {
	if e.cfg.Encrypt {
		return flagEncrypt
	}
	return 0
}

// dialHandshake authenticates an outgoing connection to peer, whose key
// the admitted set must hold. It returns the connection to use for frames.
func (e *Engine) dialHandshake(a transfer.Authenticator, conn net.Conn, peer string) (*secureConn, error) {
	k, ok := a.KeyOf(peer)
	if !ok {
		return nil, fmt.Errorf("no public key known for peer %q: %w", peer, security.ErrNotAdmitted)
	}
	key := security.Key(k)
	nc, err := noiseConfig(a, true, key)
	if err != nil {
		return nil, err
	}
	hs, err := noise.NewHandshakeState(nc)
	if err != nil {
		return nil, fmt.Errorf("handshake: %w", err)
	}
	conn.SetDeadline(time.Now().Add(e.cfg.FrameTimeout))
	defer conn.SetDeadline(time.Time{})
	m1, _, _, err := hs.WriteMessage(nil, []byte{e.flags()})
	if err != nil {
		return nil, fmt.Errorf("handshake: %w", err)
	}
	if err := writeNoiseMsg(conn, authMagic, m1); err != nil {
		return nil, fmt.Errorf("handshake: send: %w", err)
	}
	m2, err := readNoiseMsg(conn)
	if err != nil {
		return nil, fmt.Errorf("handshake with %q: no answer (is its key %s? does it admit ours?): %w", peer, key, err)
	}
	payload, send, recv, err := hs.ReadMessage(nil, m2)
	if err != nil || len(payload) != 1 || send == nil {
		return nil, fmt.Errorf("handshake with %q: the listener does not hold key %s: %w", peer, key, security.ErrNotAdmitted)
	}
	return newSecureConn(conn, send, recv, (payload[0]|e.flags())&flagEncrypt != 0), nil
}

// acceptHandshake authenticates an incoming connection and returns the
// connection to use for frames and the admitted peer that owns the
// dialer's key.
func (e *Engine) acceptHandshake(a transfer.Authenticator, conn net.Conn) (*secureConn, string, error) {
	var magic [len(authMagic)]byte
	if _, err := io.ReadFull(conn, magic[:]); err != nil {
		return nil, "", fmt.Errorf("read handshake: %w: %w", errUnauthenticated, err)
	}
	if string(magic[:]) != authMagic {
		return nil, "", fmt.Errorf("connection without the authenticated handshake (a plain HELLO?): %w", errUnauthenticated)
	}
	m1, err := readNoiseMsg(conn)
	if err != nil {
		return nil, "", fmt.Errorf("read handshake: %w: %w", errUnauthenticated, err)
	}
	nc, err := noiseConfig(a, false, security.Key{})
	if err != nil {
		return nil, "", err
	}
	hs, err := noise.NewHandshakeState(nc)
	if err != nil {
		return nil, "", fmt.Errorf("handshake: %w", err)
	}
	payload, _, _, err := hs.ReadMessage(nil, m1)
	if err != nil || len(payload) != 1 {
		return nil, "", fmt.Errorf("handshake message 1 does not decrypt (sent to another key?): %w", errUnauthenticated)
	}
	var key security.Key
	copy(key[:], hs.PeerStatic())
	name, ok := a.NameOf(key)
	if !ok {
		return nil, "", fmt.Errorf("dialer key %s is not an admitted peer: %w: %w", key, security.ErrNotAdmitted, errUnauthenticated)
	}
	m2, recv, send, err := hs.WriteMessage(nil, []byte{e.flags()})
	if err != nil {
		return nil, "", fmt.Errorf("handshake: %w", err)
	}
	if err := writeNoiseMsg(conn, "", m2); err != nil {
		return nil, "", fmt.Errorf("handshake: send: %w", err)
	}
	return newSecureConn(conn, send, recv, (payload[0]|e.flags())&flagEncrypt != 0), name, nil
}

// secureConn carries frames over an authenticated connection: in AES-GCM
// records while sealed, in the clear once unsealed (encryption off, after
// the HELLO). One goroutine reads and one writes at a time.
type secureConn struct {
	net.Conn
	enc, dec *noise.CipherState
	encrypt  bool // keep sealing after the HELLO

	sealedW, sealedR bool
	rbuf             []byte // decrypted bytes not yet read
	rrec             []byte // record scratch
	wrec             []byte
}

func newSecureConn(c net.Conn, enc, dec *noise.CipherState, encrypt bool) *secureConn {
	return &secureConn{Conn: c, enc: enc, dec: dec, encrypt: encrypt, sealedW: true, sealedR: true}
}

// helloWritten switches the write direction to plaintext after the HELLO
// when encryption is off (the dialer's side).
func (c *secureConn) helloWritten() { c.sealedW = c.encrypt }

// helloRead switches the read direction to plaintext after the HELLO when
// encryption is off (the listener's side); the HELLO must have filled its
// records exactly.
func (c *secureConn) helloRead() error {
	if c.encrypt {
		return nil
	}
	if len(c.rbuf) != 0 {
		return fmt.Errorf("%d sealed bytes after the HELLO: %w", len(c.rbuf), errProtocol)
	}
	c.sealedR = false
	return nil
}

// unsealReplies makes the direction that carries no HELLO plaintext at once
// when encryption is off: the listener's writes (ACK, NACK) and the
// dialer's reads.
func (c *secureConn) unsealReplies(listener bool) {
	if c.encrypt {
		return
	}
	if listener {
		c.sealedW = false
	} else {
		c.sealedR = false
	}
}

// Read implements net.Conn.
func (c *secureConn) Read(p []byte) (int, error) {
	if len(c.rbuf) == 0 {
		if !c.sealedR {
			return c.Conn.Read(p)
		}
		if err := c.readRecord(); err != nil {
			return 0, err
		}
	}
	n := copy(p, c.rbuf)
	c.rbuf = c.rbuf[n:]
	return n, nil
}

func (c *secureConn) readRecord() error {
	var l [2]byte
	if _, err := io.ReadFull(c.Conn, l[:]); err != nil {
		return err
	}
	n := int(binary.LittleEndian.Uint16(l[:]))
	if n < recordOverhead {
		return fmt.Errorf("record of %d bytes: %w", n, errProtocol)
	}
	if cap(c.rrec) < n {
		c.rrec = make([]byte, n, maxRecord+recordOverhead)
	}
	rec := c.rrec[:n]
	if _, err := io.ReadFull(c.Conn, rec); err != nil {
		return err
	}
	out, err := c.dec.Decrypt(rec[:0], nil, rec)
	if err != nil {
		return fmt.Errorf("record does not authenticate: %w", errProtocol)
	}
	c.rbuf = out
	return nil
}

// Write implements net.Conn.
func (c *secureConn) Write(p []byte) (int, error) {
	n, err := c.writeBuffers([][]byte{p})
	return int(n), err
}

// writeBuffers writes bufs in order, coalescing them into records of at
// most maxRecord bytes while sealed.
func (c *secureConn) writeBuffers(bufs [][]byte) (int64, error) {
	if !c.sealedW {
		nb := net.Buffers(bufs)
		return nb.WriteTo(c.Conn)
	}
	if c.wrec == nil {
		c.wrec = make([]byte, 0, 2+maxRecord+recordOverhead)
	}
	var total int64
	plain := make([]byte, 0, maxRecord)
	flush := func() error {
		if len(plain) == 0 {
			return nil
		}
		rec := binary.LittleEndian.AppendUint16(c.wrec[:0], uint16(len(plain)+recordOverhead))
		rec, err := c.enc.Encrypt(rec, nil, plain)
		if err != nil {
			return err
		}
		if _, err := c.Conn.Write(rec); err != nil {
			return err
		}
		total += int64(len(plain))
		plain = plain[:0]
		return nil
	}
	for _, b := range bufs {
		for len(b) > 0 {
			k := min(len(b), maxRecord-len(plain))
			plain = append(plain, b[:k]...)
			b = b[k:]
			if len(plain) == maxRecord {
				if err := flush(); err != nil {
					return total, err
				}
			}
		}
	}
	return total, flush()
}

// writeBufs writes bufs to conn, sealed when conn is a secureConn.
func writeBufs(conn net.Conn, bufs [][]byte) error {
	if sc, ok := conn.(*secureConn); ok {
		_, err := sc.writeBuffers(bufs)
		return err
	}
	nb := net.Buffers(bufs)
	_, err := nb.WriteTo(conn)
	return err
}

// forbidden is the NACK reason of a write the guard refused.
func forbidden(err error) error { return fmt.Errorf("%w: %w", transfer.ErrForbidden, err) }
