package security

import (
	"bufio"
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// KeyLen is the length of a public or secret key in bytes.
const KeyLen = 32

// Key is an X25519 public key. The zero Key means "no key" (an agent that
// runs with security.mode off).
type Key [KeyLen]byte

// IsZero reports whether k is the zero key.
func (k Key) IsZero() bool { return k == Key{} }

// String returns k in Z85 (40 characters), the form ZeroMQ's CURVE and
// key files use. Z85 has shell metacharacters (# ) & < > ...): what a user
// copies is Text.
func (k Key) String() string { return z85Encode(k[:]) }

// Text returns k in unpadded base64url (43 characters of A-Z, a-z, 0-9,
// '-' and '_'): the form `bounce key` prints, safe to paste unquoted into a
// shell, a YAML value or an allowed_peers list. ParseKey reads it.
func (k Key) Text() string { return base64.RawURLEncoding.EncodeToString(k[:]) }

// ParseKey decodes a public key: Text's base64url (43 characters) or Z85
// (40 characters).
func ParseKey(s string) (Key, error) {
	var k Key
	var b []byte
	var err error
	switch len(s) {
	case 43:
		b, err = base64.RawURLEncoding.DecodeString(s)
	case 40:
		b, err = z85Decode(s)
	default:
		return k, fmt.Errorf("security: key %q: %d characters, want 43 (base64url, as bounce key prints) or 40 (Z85) for 32 bytes", s, len(s))
	}
	if err != nil {
		return k, fmt.Errorf("security: key %q: %w", s, err)
	}
	copy(k[:], b)
	if k.IsZero() {
		return k, fmt.Errorf("security: key %q is all zeros", s)
	}
	return k, nil
}

// Identity is an agent's key pair.
type Identity struct {
	Public Key
	Secret [KeyLen]byte
}

// Generate returns a fresh identity from rand (crypto/rand.Reader if nil).
func Generate(r io.Reader) (Identity, error) {
	if r == nil {
		r = rand.Reader
	}
	priv, err := ecdh.X25519().GenerateKey(r)
	if err != nil {
		return Identity{}, fmt.Errorf("security: generate key: %w", err)
	}
	return identityOf(priv), nil
}

func identityOf(priv *ecdh.PrivateKey) Identity {
	var id Identity
	copy(id.Secret[:], priv.Bytes())
	copy(id.Public[:], priv.PublicKey().Bytes())
	return id
}

// FromSecret derives the identity of a Z85 secret key.
func FromSecret(z85 string) (Identity, error) {
	if len(z85) != 40 {
		return Identity{}, fmt.Errorf("security: secret key: %d characters, want 40 (Z85 of 32 bytes)", len(z85))
	}
	b, err := z85Decode(z85)
	if err != nil {
		return Identity{}, fmt.Errorf("security: secret key: %w", err)
	}
	priv, err := ecdh.X25519().NewPrivateKey(b)
	if err != nil {
		return Identity{}, fmt.Errorf("security: secret key: %w", err)
	}
	return identityOf(priv), nil
}

// SecretZ85 returns the secret key in Z85.
func (id Identity) SecretZ85() string { return z85Encode(id.Secret[:]) }

// Key file format: comment lines start with '#'; "public <z85>" and
// "secret <z85>" lines. The public line must match the secret.
const keyFileHeader = "# bounce agent key (X25519, Z85). Keep this file private (mode 0600).\n"

// ErrKeyFileMode means a key file is readable or writable by others.
var ErrKeyFileMode = errors.New("key file is accessible by group or others")

// LoadOrCreate reads the identity in path, or generates one and writes it
// there (mode 0600, refusing to overwrite) when the file does not exist. A
// key file that group or others may read or write is refused with an error
// wrapping ErrKeyFileMode.
func LoadOrCreate(path string) (Identity, bool, error) {
	id, err := Load(path)
	if err == nil {
		return id, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return Identity{}, false, err
	}
	if id, err = Generate(nil); err != nil {
		return Identity{}, false, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Identity{}, false, fmt.Errorf("security: create key file %s: %w", path, err)
	}
	_, werr := fmt.Fprintf(f, "%spublic %s\nsecret %s\n", keyFileHeader, id.Public, id.SecretZ85())
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return Identity{}, false, fmt.Errorf("security: write key file %s: %w", path, werr)
	}
	return id, true, nil
}

// Load reads the identity in path (see LoadOrCreate for the mode rule).
func Load(path string) (Identity, error) {
	st, err := os.Stat(path)
	if err != nil {
		return Identity{}, fmt.Errorf("security: key file: %w", err)
	}
	if m := st.Mode().Perm(); m&0o077 != 0 {
		return Identity{}, fmt.Errorf("security: key file %s has mode %04o: %w; run chmod 600 %s", path, m, ErrKeyFileMode, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Identity{}, fmt.Errorf("security: key file: %w", err)
	}
	return parseKeyFile(path, b)
}

func parseKeyFile(path string, b []byte) (Identity, error) {
	var pub, sec string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, _ := strings.Cut(line, " ")
		switch k {
		case "public":
			pub = strings.TrimSpace(v)
		case "secret":
			sec = strings.TrimSpace(v)
		default:
			return Identity{}, fmt.Errorf("security: key file %s line %d: want \"public <z85>\" or \"secret <z85>\"", path, n)
		}
	}
	if sec == "" {
		return Identity{}, fmt.Errorf("security: key file %s has no secret line", path)
	}
	id, err := FromSecret(sec)
	if err != nil {
		return Identity{}, fmt.Errorf("security: key file %s: %w", path, err)
	}
	if pub != "" && pub != id.Public.String() {
		return Identity{}, fmt.Errorf("security: key file %s: public key %s does not match the secret key (its public key is %s)", path, pub, id.Public)
	}
	return id, nil
}
