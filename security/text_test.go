package security

import (
	"regexp"
	"testing"

	"pgregory.net/rapid"
)

// TestKeyTextPastesSafely: Text is 43 characters with no shell
// metacharacter (nothing a shell, YAML or an allowed_peers list would
// read specially), and ParseKey reads both it and Z85 back to the same key.
func TestKeyTextPastesSafely(t *testing.T) {
	safe := regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)
	rapid.Check(t, func(t *rapid.T) {
		var k Key
		copy(k[:], rapid.SliceOfN(rapid.Byte(), KeyLen, KeyLen).Draw(t, "key"))
		if k.IsZero() {
			return
		}
		if !safe.MatchString(k.Text()) {
			t.Fatalf("Text %q is not 43 characters of [A-Za-z0-9_-]", k.Text())
		}
		for _, s := range []string{k.Text(), k.String()} {
			got, err := ParseKey(s)
			if err != nil || got != k {
				t.Fatalf("ParseKey(%q) = %v, %v; want the key back", s, got, err)
			}
		}
		p, err := ParsePolicy("host-a="+k.Text(), nil)
		if err != nil || p.Static["host-a"] != k {
			t.Fatalf("ParsePolicy(host-a=%s) = %+v, %v", k.Text(), p, err)
		}
	})
}
