package config

import (
	"fmt"
	"regexp"
	"strings"
)

// envRef matches ${env:NAME} and ${env:NAME:-default} in a YAML string
// value, as the OpenTelemetry Collector writes them.
var envRef = regexp.MustCompile(`\$\{env:([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}`)

// expandEnv replaces every ${env:NAME} in s with the variable's value
// (${env:NAME:-default}: default when it is unset or empty) and $$ with a
// literal $. Unlike the Collector, which expands an unset variable to
// nothing, an unset variable without a default is an error: a missing
// value is a clear error, never a silent empty string.
func expandEnv(s string, env map[string]string) (string, error) {
	if !strings.Contains(s, "$") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "$$"):
			b.WriteByte('$')
			i += 2
		case strings.HasPrefix(s[i:], "${env:"):
			m := envRef.FindStringSubmatchIndex(s[i:])
			if m == nil || m[0] != 0 {
				return "", fmt.Errorf("%q: a reference is ${env:NAME} or ${env:NAME:-default}", s[i:])
			}
			name := s[i+m[2] : i+m[3]]
			v, ok := env[name]
			if m[4] >= 0 && v == "" {
				v, ok = s[i+m[4]+2:i+m[5]], true
			}
			if !ok {
				return "", fmt.Errorf("${env:%s}: %s is not set (give a default: ${env:%s:-value})", name, name, name)
			}
			b.WriteString(v)
			i += m[1]
		default:
			b.WriteByte(s[i])
			i++
		}
	}
	return b.String(), nil
}

// expandTree applies expandEnv to every string value in v (a parsed YAML
// document), in place; path names the value in errors.
func expandTree(v any, path string, env map[string]string) (any, error) {
	switch t := v.(type) {
	case string:
		s, err := expandEnv(t, env)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return s, nil
	case map[string]any:
		for k, e := range t {
			p := k
			if path != "" {
				p = path + "." + k
			}
			x, err := expandTree(e, p, env)
			if err != nil {
				return nil, err
			}
			t[k] = x
		}
	case []any:
		for i, e := range t {
			x, err := expandTree(e, fmt.Sprintf("%s[%d]", path, i), env)
			if err != nil {
				return nil, err
			}
			t[i] = x
		}
	}
	return v, nil
}
