package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	yamlv3 "go.yaml.in/yaml/v3"
)

// RegisterFlags adds one flag per key to fs, named by the dotted key with
// underscores turned into dashes: --bounce.arena-size, --engine.kind,
// --control-plane.send-hwm. Boolean flags may be given bare (--bounce.enabled
// means true). --engine.options takes k1=v1,k2=v2 and may be repeated.
// Values are checked when parsed, so fs.Parse reports a bad one, and again
// by Load, which applies only the flags the user set. Like pflag, it panics
// if fs already defines one of these names.
func RegisterFlags(fs *pflag.FlagSet) {
	def := Default()
	subs := subKeys()
	for _, f := range fields() {
		v := &flagValue{ptr: f.ptr(new(Config)), key: f.key}
		fl := fs.VarPF(v, flagName(f.key), "", f.help)
		fl.DefValue = showDefault(f.ptr(&def))
		if _, ok := v.ptr.(*bool); ok {
			fl.NoOptDefVal = "true"
		}
		for _, s := range subs {
			if s.field != f.key {
				continue
			}
			sv := &subFlagValue{s: s}
			sfl := fs.VarPF(sv, flagName(s.key), "", s.help)
			if _, ok := s.ptr().(*bool); ok {
				sfl.NoOptDefVal = "true"
			}
		}
	}
}

// subFlagValue is the flag of one plugin block key
// (--stages.gather.plugin.path). Lists and options accumulate when
// repeated.
type subFlagValue struct {
	s    subKey
	text string
}

// String returns the text set so far.
func (v *subFlagValue) String() string { return v.text }

// Set checks s and records it.
func (v *subFlagValue) Set(s string) error {
	if _, ok := v.s.subText(s); !ok {
		return fmt.Errorf("%s: %s", v.s.key, v.s.subReason())
	}
	switch v.s.ptr().(type) {
	case *[]string, *map[string]string:
		if v.text != "" && s != "" {
			s = v.text + "," + s
		}
	}
	v.text = s
	return nil
}

// Type names the value kind in --help.
func (v *subFlagValue) Type() string {
	switch v.s.ptr().(type) {
	case *[]string:
		return "list"
	case *map[string]string:
		return "k=v,..."
	}
	return (&flagValue{ptr: v.s.ptr()}).Type()
}

func showDefault(ptr any) string {
	switch p := ptr.(type) {
	case *map[string]string:
		return joinOptions(*p)
	default:
		return fmt.Sprint(render(ptr))
	}
}

func joinOptions(m map[string]string) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

// flagValue holds a flag's text as the user wrote it; parsing into the
// Config happens in Load. Set checks the syntax early for a clear error.
type flagValue struct {
	ptr  any // a field of a scratch Config, for checking and the type name
	key  string
	text string
}

// String returns the text set so far.
func (v *flagValue) String() string { return v.text }

// Set checks s and records it; repeated --engine.options accumulate.
func (v *flagValue) Set(s string) error {
	if _, ok := v.ptr.(*map[string]string); ok {
		if _, ok := parseOptions(s); !ok {
			return fmt.Errorf("%s: %s", v.key, accepted(v.ptr))
		}
		if v.text != "" && s != "" {
			s = v.text + "," + s
		}
		v.text = s
		return nil
	}
	if !assign(v.ptr, s) {
		return fmt.Errorf("%s: %s", v.key, accepted(v.ptr))
	}
	v.text = s
	return nil
}

// Type names the value kind in --help.
func (v *flagValue) Type() string {
	switch v.ptr.(type) {
	case *int:
		return "int"
	case *bool:
		return "bool"
	case *Size:
		return "size"
	case *time.Duration:
		return "duration"
	case *float64:
		return "float"
	case *map[string]string:
		return "k=v,..."
	default:
		return "string"
	}
}

// YAML renders the configuration as a YAML document Load accepts, with
// every key in documentation order and its help as a comment.
func (c Config) YAML() ([]byte, error) {
	root := &yamlv3.Node{Kind: yamlv3.MappingNode}
	sections := map[string]*yamlv3.Node{}
	for _, f := range fields() {
		section, name := splitKey(f.key)
		sec, ok := sections[section]
		if !ok {
			sec = &yamlv3.Node{Kind: yamlv3.MappingNode}
			sections[section] = sec
			root.Content = append(root.Content, strNode(section), sec)
		}
		// A grouped key (telemetry.metrics.listen) nests under its group.
		for group, rest, ok := strings.Cut(name, "."); ok; group, rest, ok = strings.Cut(rest, ".") {
			sec = subMapping(sec, group)
			name = rest
		}
		k := strNode(name)
		k.HeadComment = f.help
		sec.Content = append(sec.Content, k, valueNode(f.ptr(&c)))
	}
	var b strings.Builder
	enc := yamlv3.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return nil, fmt.Errorf("config: render YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: render YAML: %w", err)
	}
	return []byte(b.String()), nil
}

// subMapping returns the mapping under key in m, adding it when missing.
func subMapping(m *yamlv3.Node, key string) *yamlv3.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key && m.Content[i+1].Kind == yamlv3.MappingNode {
			return m.Content[i+1]
		}
	}
	sub := &yamlv3.Node{Kind: yamlv3.MappingNode}
	m.Content = append(m.Content, strNode(key), sub)
	return sub
}

func strNode(s string) *yamlv3.Node {
	return &yamlv3.Node{Kind: yamlv3.ScalarNode, Tag: "!!str", Value: s}
}

func valueNode(ptr any) *yamlv3.Node {
	switch p := ptr.(type) {
	case *map[string]string:
		n := &yamlv3.Node{Kind: yamlv3.MappingNode, Style: yamlv3.FlowStyle}
		if len(*p) > 0 {
			n.Style = 0
		}
		for _, k := range slices.Sorted(maps.Keys(*p)) {
			n.Content = append(n.Content, strNode(k), strNode((*p)[k]))
		}
		return n
	case *int:
		return &yamlv3.Node{Kind: yamlv3.ScalarNode, Tag: "!!int", Value: fmt.Sprint(*p)}
	case *bool:
		return &yamlv3.Node{Kind: yamlv3.ScalarNode, Tag: "!!bool", Value: fmt.Sprint(*p)}
	case *float64:
		var n yamlv3.Node
		if err := n.Encode(*p); err != nil { // yaml's own float text (.nan, .inf, 0.5)
			return strNode(fmt.Sprint(*p))
		}
		return &n
	case *PluginConfig, *StageConfig:
		var n yamlv3.Node
		if err := n.Encode(render(p)); err != nil {
			return strNode(fmt.Sprint(render(p)))
		}
		return &n
	default:
		return strNode(fmt.Sprint(render(ptr)))
	}
}
