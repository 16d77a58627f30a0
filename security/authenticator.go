package security

import (
	"crypto/ecdh"
	"fmt"

	"github.com/bouncekv/bounce/transfer"
)

// Authenticator returns the agent's authority over its peers' identities
// for an engine that authenticates connections without holding the key
// (transfer.Authenticating: an engine in a plugin process): DH uses the
// secret inside this process, KeyOf and NameOf read the admitted set as it
// is at each call. Nil when authentication is off.
func (p *Peers) Authenticator() transfer.Authenticator {
	if !p.Enabled() {
		return nil
	}
	return authenticator{p}
}

type authenticator struct{ p *Peers }

func (a authenticator) PublicKey() [32]byte { return a.p.self.Public }

// DH returns X25519(the agent's secret, pub); a low-order pub is refused.
func (a authenticator) DH(pub [32]byte) ([32]byte, error) {
	return a.p.self.DH(pub)
}

func (a authenticator) KeyOf(peer string) ([32]byte, bool) { return a.p.KeyOf(peer) }

func (a authenticator) NameOf(key [32]byte) (string, bool) { return a.p.NameOf(key) }

// DH returns the X25519 product of the identity's secret and pub.
func (id Identity) DH(pub [32]byte) ([32]byte, error) {
	var out [32]byte
	priv, err := ecdh.X25519().NewPrivateKey(id.Secret[:])
	if err != nil {
		return out, fmt.Errorf("security: secret key: %w", err)
	}
	pk, err := ecdh.X25519().NewPublicKey(pub[:])
	if err != nil {
		return out, fmt.Errorf("security: public key: %w", err)
	}
	s, err := priv.ECDH(pk)
	if err != nil {
		return out, fmt.Errorf("security: X25519 with %s: %w", Key(pub), err)
	}
	copy(out[:], s)
	return out, nil
}
