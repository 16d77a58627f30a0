package config

import (
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/bouncekv/bounce/security"
)

// securityDefaultsTable returns the rows of docs/SECURITY.md's "Limits and
// their defaults" table whose first cell is one config key, as key ->
// default cell with its spaces removed ("4 MiB" -> "4MiB").
func securityDefaultsTable(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../docs/SECURITY.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n## Limits and their defaults\n")
	if !ok {
		t.Fatal("docs/SECURITY.md has no \"Limits and their defaults\" section")
	}
	known := make(map[string]bool)
	for _, k := range Keys() {
		known[k] = true
	}
	rows := make(map[string]string)
	for _, line := range strings.Split(rest, "\n") {
		if strings.HasPrefix(line, "#") {
			break
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		key := strings.TrimSpace(cells[1])
		if len(key) < 2 || key[0] != '`' || key[len(key)-1] != '`' || !known[key[1:len(key)-1]] {
			continue
		}
		rows[key[1:len(key)-1]] = strings.ReplaceAll(strings.TrimSpace(cells[2]), " ", "")
	}
	return rows
}

// TestDocumentedDefaultsAreTheCode: each single-key row of SECURITY.md's
// defaults table states the default the key's --help shows (Default()),
// and security.max_message_size's is security.DefaultMaxMessageSize, the
// one constant the config and the ZeroMQ channel both take it from.
func TestDocumentedDefaultsAreTheCode(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	RegisterFlags(fs)
	rows := securityDefaultsTable(t)
	const key = "security.max_message_size"
	want := Size(security.DefaultMaxMessageSize).String()
	if got, ok := rows[key]; !ok {
		t.Fatalf("docs/SECURITY.md's defaults table has no %s row", key)
	} else if got != want {
		t.Errorf("docs/SECURITY.md: %s default %q, security.DefaultMaxMessageSize is %s", key, got, want)
	}
	if got := Default().Security.MaxMessageSize; got != Size(security.DefaultMaxMessageSize) {
		t.Errorf("Default().Security.MaxMessageSize = %s, security.DefaultMaxMessageSize is %s", got, want)
	}
	if fl := fs.Lookup(flagName(key)); fl == nil || fl.DefValue != want {
		t.Errorf("--%s help default %v, want %s", flagName(key), fl, want)
	}
	for k, doc := range rows {
		if fl := fs.Lookup(flagName(k)); fl != nil && fl.DefValue != doc {
			t.Errorf("docs/SECURITY.md: %s default %q, --%s shows (default %s)", k, doc, flagName(k), fl.DefValue)
		}
	}
}
