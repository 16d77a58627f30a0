package security

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// Mode is the trust policy (security.mode).
type Mode uint8

const (
	// Authenticate admits only peers whose key the policy allows and binds
	// every connection to the agent that owns the key (the default).
	Authenticate Mode = iota
	// Off trusts the network: no keys, no authentication. For benchmarks
	// and closed test networks only; the agent warns loudly at start.
	Off
)

// String returns "authenticate" or "off".
func (m Mode) String() string {
	if m == Off {
		return "off"
	}
	return "authenticate"
}

// ParseMode parses security.mode.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "authenticate", "":
		return Authenticate, nil
	case "off":
		return Off, nil
	}
	return 0, fmt.Errorf("security: mode %q: accepted: authenticate, off", s)
}

// LoadedPeers is the allowed_peers entry that admits every peer a
// descriptor loaded by LoadPeer (or discovery) introduced, with the key
// that descriptor carries.
const LoadedPeers = "loaded"

// Policy says which peers are admitted (security.allowed_peers).
type Policy struct {
	// Loaded admits the peers LoadPeer introduced.
	Loaded bool
	// Static binds agent names to keys admitted from the start.
	Static map[string]Key
}

// ErrNotAdmitted means a peer's key or name is not in the admitted set.
var ErrNotAdmitted = errors.New("peer not admitted")

// ParsePolicy parses security.allowed_peers: comma-separated entries, each
// "loaded", "NAME=KEY" (KEY in Z85), or "@PATH", a file of "NAME KEY" or
// "NAME=KEY" lines ('#' starts a comment). readFile reads such a file.
// Names are split from keys at the first '=' (agent names in allowed_peers
// must not contain one; Z85 keys may).
func ParsePolicy(s string, readFile func(string) ([]byte, error)) (Policy, error) {
	p := Policy{Static: map[string]Key{}}
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
		case e == LoadedPeers:
			p.Loaded = true
		case strings.HasPrefix(e, "@"):
			b, err := readFile(e[1:])
			if err != nil {
				return Policy{}, fmt.Errorf("security: allowed peers file %s: %w", e[1:], err)
			}
			sc := bufio.NewScanner(bytes.NewReader(b))
			for n := 1; sc.Scan(); n++ {
				line := strings.TrimSpace(sc.Text())
				if line == "" || line[0] == '#' {
					continue
				}
				if f := strings.Fields(line); len(f) == 2 {
					line = f[0] + "=" + f[1]
				}
				if err := p.addEntry(line); err != nil {
					return Policy{}, fmt.Errorf("security: allowed peers file %s line %d: %w", e[1:], n, err)
				}
			}
		default:
			if err := p.addEntry(e); err != nil {
				return Policy{}, fmt.Errorf("security: allowed peers entry %q: %w", e, err)
			}
		}
	}
	return p, nil
}

func (p *Policy) addEntry(e string) error {
	name, z, ok := strings.Cut(e, "=")
	if !ok || name == "" {
		return errors.New(`want "loaded", "NAME=KEY" or "@FILE"`)
	}
	k, err := ParseKey(z)
	if err != nil {
		return err
	}
	if old, dup := p.Static[name]; dup && old != k {
		return fmt.Errorf("agent %q listed with two keys", name)
	}
	for n, o := range p.Static {
		if o == k && n != name {
			return fmt.Errorf("key %s listed for both %q and %q", k, n, name)
		}
	}
	p.Static[name] = k
	return nil
}

// Peers is the admitted-peer set: a one-to-one binding of agent names to
// public keys. It is safe for concurrent use; the control plane, the
// engine and the pipeline share one. A nil *Peers is security.mode off:
// every name is admitted and no key is known.
type Peers struct {
	mode   Mode
	self   Identity
	policy Policy

	mu     sync.RWMutex
	byName map[string]Key
	byKey  map[Key]string
}

// NewPeers returns the admitted set of an agent with identity self.
func NewPeers(mode Mode, self Identity, policy Policy) *Peers {
	p := &Peers{mode: mode, self: self, policy: policy, byName: map[string]Key{}, byKey: map[Key]string{}}
	for n, k := range policy.Static {
		p.byName[n], p.byKey[k] = k, n
	}
	return p
}

// Enabled reports whether authentication is on.
func (p *Peers) Enabled() bool { return p != nil && p.mode == Authenticate }

// Mode returns the trust policy's mode.
func (p *Peers) Mode() Mode { return p.mode }

// Self returns this agent's identity.
func (p *Peers) Self() Identity { return p.self }

// Introduce binds name to key because a descriptor the application loaded
// says so. It is refused (ErrNotAdmitted) when the policy does not admit
// loaded peers and allowed_peers does not list name with this key, when key
// is zero, or when key already belongs to another agent. Introducing a
// known name with a new key rebinds it (a loaded descriptor is an explicit
// act of trust; a key rotation is loaded this way).
func (p *Peers) Introduce(name string, key Key) error {
	if !p.Enabled() {
		return nil
	}
	if key.IsZero() {
		return fmt.Errorf("security: peer %q: its descriptor carries no public key (it runs with security.mode off?): %w", name, ErrNotAdmitted)
	}
	if sk, ok := p.policy.Static[name]; ok && sk != key {
		return fmt.Errorf("security: peer %q: descriptor key %s differs from the key allowed_peers lists (%s): %w", name, key.Text(), sk.Text(), ErrNotAdmitted)
	} else if !ok && !p.policy.Loaded {
		return fmt.Errorf("security: peer %q (key %s) is not listed in security.allowed_peers and %q is not allowed: %w", name, key.Text(), LoadedPeers, ErrNotAdmitted)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if other, ok := p.byKey[key]; ok && other != name {
		return fmt.Errorf("security: peer %q: key %s already belongs to agent %q: %w", name, key, other, ErrNotAdmitted)
	}
	if old, ok := p.byName[name]; ok && old != key {
		delete(p.byKey, old)
	}
	p.byName[name], p.byKey[key] = key, name
	return nil
}

// Forget drops a binding LoadPeer introduced; bindings from allowed_peers
// stay.
func (p *Peers) Forget(name string) {
	if !p.Enabled() {
		return
	}
	if _, static := p.policy.Static[name]; static {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if k, ok := p.byName[name]; ok {
		delete(p.byName, name)
		delete(p.byKey, k)
	}
}

// KeyOf returns the key bound to name.
func (p *Peers) KeyOf(name string) (Key, bool) {
	if p == nil {
		return Key{}, false
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	k, ok := p.byName[name]
	return k, ok
}

// NameOf returns the agent that owns key.
func (p *Peers) NameOf(key Key) (string, bool) {
	if p == nil {
		return "", false
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	n, ok := p.byKey[key]
	return n, ok
}

// Admitted reports whether name is an admitted peer. With authentication
// off every name is.
func (p *Peers) Admitted(name string) bool {
	if !p.Enabled() {
		return true
	}
	_, ok := p.KeyOf(name)
	return ok
}

// Check returns nil when key belongs to the agent name, else an error
// wrapping ErrNotAdmitted that says which of the two is wrong.
func (p *Peers) Check(name string, key Key) error {
	if !p.Enabled() {
		return nil
	}
	owner, ok := p.NameOf(key)
	switch {
	case !ok:
		return fmt.Errorf("security: key %s is not admitted: %w", key, ErrNotAdmitted)
	case owner != name:
		return fmt.Errorf("security: key %s belongs to %q, not %q: %w", key, owner, name, ErrNotAdmitted)
	}
	return nil
}
