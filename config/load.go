package config

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
)

// Source says where a setting's value came from: "default", "file:<path>",
// "env:<VAR>" or "flag:--<name>".
type Source string

// SourceDefault marks a value nobody set.
const SourceDefault Source = "default"

// Loaded is the outcome of Load.
type Loaded struct {
	// Config is the effective, normalized and validated configuration.
	Config Config
	// Sources maps every dotted key to where its value came from. Options
	// appear both as "engine.options" (the last layer that set any) and as
	// "engine.options.<name>" per option.
	Sources map[string]Source
	// Notices describes adjustments Load made (see Config.Normalize), for
	// the caller to log.
	Notices []string
}

// LoadOptions names the layers Load reads.
type LoadOptions struct {
	// File is a YAML file; empty means none.
	File string
	// FileData, when non-nil, is used as the YAML file's contents instead of
	// reading File (File then only names it in Sources and errors; it
	// defaults to "inline").
	FileData []byte
	// Environ is the environment as os.Environ returns it; nil means none.
	// Only variables starting with EnvPrefix are read.
	Environ []string
	// Flags is a flag set with RegisterFlags applied and already parsed; nil
	// means none. Only flags the user set count; other flags are ignored.
	Flags *pflag.FlagSet
}

// Load builds the configuration from four layers, each overriding the one
// before: the defaults, the YAML file, the environment, and the flags.
//
// It is strict: an unknown key in the file, a BOUNCE_ variable that names
// no key, a value that does not parse (in any layer, even one a later layer
// overrides) and a value out of range are errors. All problems are reported
// together, each a *KeyError naming the key, the value, its source and what
// is accepted. After the layers are merged Load applies Config.Normalize
// (clamping bounce.max_chunk, reported in Notices) and Config.Validate.
func Load(opts LoadOptions) (*Loaded, error) {
	fs := fields()
	def := Default()
	k := koanf.New(".")
	var errs []*KeyError
	defaults := map[string]any{}
	sources := make(map[string]Source, len(fs))
	for _, f := range fs {
		defaults[f.key] = render(f.ptr(&def))
		sources[f.key] = SourceDefault
	}
	subs := subKeys()
	for _, s := range subs {
		sources[s.key] = SourceDefault
	}
	// subValue turns a plugin block key's text (a flag, a variable) into
	// the raw value its block holds; src is where it came from, recorded
	// for the block's field too.
	subValue := func(s subKey, value string, src Source, srcs map[string]Source) any {
		v, ok := s.subText(value)
		if !ok {
			errs = append(errs, &KeyError{Key: s.key, Value: value, Source: src, Err: ErrBadValue, Reason: s.subReason()})
			return nil
		}
		srcs[s.key] = src
		if srcs[s.field] == "" {
			srcs[s.field] = src
		}
		return v
	}
	if err := k.Load(confmap.Provider(defaults, "."), nil); err != nil {
		return nil, fmt.Errorf("config: load defaults: %w", err)
	}

	merge := func(layer *koanf.Koanf, srcOf func(key string) Source) error {
		clean, bad := checkLayer(fs, layer.Raw(), srcOf, sources)
		errs = append(errs, bad...)
		if err := k.Load(confmap.Provider(clean, ""), nil); err != nil {
			return fmt.Errorf("config: merge layer: %w", err)
		}
		return nil
	}

	if opts.File != "" || opts.FileData != nil {
		name := opts.File
		if name == "" {
			name = "inline"
		}
		src := Source("file:" + name)
		var p koanf.Provider = file.Provider(opts.File)
		if opts.FileData != nil {
			p = bytesProvider(opts.FileData)
		}
		fk := koanf.New(".")
		if err := fk.Load(p, safeYAML{env: environMap(opts.Environ)}); err != nil {
			return nil, fmt.Errorf("config: read %s: %w", src, err)
		}
		if err := merge(fk, func(string) Source { return src }); err != nil {
			return nil, err
		}
	}

	if opts.Environ != nil {
		byEnv := map[string]string{}
		for _, f := range fs {
			byEnv[envName(f.key)] = f.key
		}
		subByEnv := map[string]subKey{}
		for _, s := range subs {
			subByEnv[envName(s.key)] = s
			byEnv[envName(s.key)] = s.key
		}
		envSrc := map[string]Source{}
		ek := koanf.New(".")
		err := ek.Load(env.Provider(".", env.Opt{
			Prefix:      EnvPrefix,
			EnvironFunc: func() []string { return opts.Environ },
			TransformFunc: func(name, value string) (string, any) {
				key, ok := byEnv[name]
				if !ok {
					errs = append(errs, &KeyError{Value: value, Source: Source("env:" + name), Err: ErrUnknownKey,
						Reason: "no setting has this environment variable" + DidYouMean(name, slices.Collect(maps.Keys(byEnv))) + "; `bounce config --keys` lists every key's variable (bounce keys drop their section: BOUNCE_ARENA_SIZE)"})
					return "", nil
				}
				if s, ok := subByEnv[name]; ok {
					if v := subValue(s, value, Source("env:"+name), envSrc); v != nil {
						return key, v
					}
					return "", nil
				}
				envSrc[key] = Source("env:" + name)
				return key, textValue(key, value, envSrc[key], &errs)
			},
		}), nil)
		if err != nil {
			return nil, fmt.Errorf("config: read environment: %w", err)
		}
		if err := merge(ek, func(key string) Source { return envSrc[key] }); err != nil {
			return nil, err
		}
	}

	if opts.Flags != nil {
		byFlag := map[string]string{}
		for _, f := range fs {
			byFlag[flagName(f.key)] = f.key
		}
		subByFlag := map[string]subKey{}
		for _, s := range subs {
			subByFlag[flagName(s.key)] = s
		}
		flagSrc := map[string]Source{}
		fk := koanf.New(".")
		err := fk.Load(posflag.ProviderWithFlag(opts.Flags, ".", nil, func(fl *pflag.Flag) (string, any) {
			if s, ok := subByFlag[fl.Name]; ok {
				if !fl.Changed {
					return "", nil
				}
				if v := subValue(s, fl.Value.String(), Source("flag:--"+fl.Name), flagSrc); v != nil {
					return s.key, v
				}
				return "", nil
			}
			key, ok := byFlag[fl.Name]
			if !ok {
				return "", nil // not ours
			}
			if fl.Changed { // posflag drops the others
				flagSrc[key] = Source("flag:--" + fl.Name)
			}
			return key, textValue(key, fl.Value.String(), flagSrc[key], &errs)
		}), nil)
		if err != nil {
			return nil, fmt.Errorf("config: read flags: %w", err)
		}
		if err := merge(fk, func(key string) Source { return flagSrc[key] }); err != nil {
			return nil, err
		}
	}

	if len(errs) > 0 {
		return nil, joinKeyErrors(errs)
	}

	var cfg Config
	merged := k.Raw()
	for _, f := range fs {
		raw, _ := lookup(merged, f.key)
		if f.key == optionsKey && raw == nil {
			continue
		}
		if !assign(f.ptr(&cfg), raw) {
			// Every layer was checked, so this is a bug, not bad input.
			return nil, fmt.Errorf("config: internal error: merged %s=%q does not parse", f.key, show(raw))
		}
	}
	notices := cfg.Normalize()
	if bad := cfg.validate(); len(bad) > 0 {
		for _, e := range bad {
			e.Source = sources[e.Key]
		}
		return nil, joinKeyErrors(bad)
	}
	return &Loaded{Config: cfg, Sources: sources, Notices: notices}, nil
}

// textValue turns the text of an environment variable or flag into the raw
// value its layer holds: options become a mapping, everything else stays
// text for checkLayer to parse.
func textValue(key, value string, src Source, errs *[]*KeyError) any {
	if key != optionsKey {
		return value
	}
	m, ok := parseOptions(value)
	if !ok {
		*errs = append(*errs, &KeyError{Key: key, Value: value, Source: src, Err: ErrBadValue, Reason: accepted(new(map[string]string))})
		return map[string]any{}
	}
	return m
}

// lookup finds a dotted key (section.name, or section.group.name) in a
// nested map.
func lookup(m map[string]any, key string) (any, bool) {
	parts := strings.Split(key, ".")
	for _, p := range parts[:len(parts)-1] {
		sub, ok := m[p].(map[string]any)
		if !ok {
			return nil, false
		}
		m = sub
	}
	v, ok := m[parts[len(parts)-1]]
	return v, ok
}

// setNested stores v under the dotted name (name or group.name) in m,
// creating the group's mapping.
func setNested(m map[string]any, name string, v any) {
	group, leaf, ok := strings.Cut(name, ".")
	if !ok {
		m[name] = v
		return
	}
	sub, _ := m[group].(map[string]any)
	if sub == nil {
		sub = map[string]any{}
		m[group] = sub
	}
	setNested(sub, leaf, v)
}

// flattenGroups turns the mappings of a section that hold grouped keys
// (telemetry: {metrics: {listen: ...}}) into dotted names
// ("metrics.listen"); every other entry keeps its name.
func flattenGroups(section string, m map[string]any, byKey map[string]field) map[string]any {
	out := make(map[string]any, len(m))
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for name, v := range m {
			full := prefix + name
			sub, isMap := v.(map[string]any)
			if _, known := byKey[section+"."+full]; !known && isMap && isGroup(byKey, section+"."+full+".") {
				walk(full+".", sub)
				continue
			}
			out[full] = v
		}
	}
	walk("", m)
	return out
}

func isGroup(byKey map[string]field, prefix string) bool {
	for k := range byKey {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// checkLayer checks one layer's nested map against the schema: unknown
// sections and keys, values that do not parse. It records the source of
// every key the layer sets and returns a map holding only the accepted
// keys, ready to merge.
func checkLayer(fs []field, raw map[string]any, srcOf func(string) Source, sources map[string]Source) (map[string]any, []*KeyError) {
	byKey := map[string]field{}
	sectionKeys := map[string][]string{}
	var sections []string
	for _, f := range fs {
		byKey[f.key] = f
		s, n := splitKey(f.key)
		if _, ok := sectionKeys[s]; !ok {
			sections = append(sections, s)
		}
		sectionKeys[s] = append(sectionKeys[s], n)
	}
	var errs []*KeyError
	clean := map[string]any{}
	for _, section := range slices.Sorted(maps.Keys(raw)) {
		val := raw[section]
		if _, ok := sectionKeys[section]; !ok {
			reason := "unknown section" + DidYouMean(section, sections) + "; sections: " + strings.Join(sections, ", ")
			if strings.Contains(section, ".") {
				reason += " (nest keys in YAML: a line \"bounce:\" and an indented \"arena_size: 1GiB\")"
			}
			errs = append(errs, &KeyError{Key: section, Value: show(val), Source: srcOf(section), Err: ErrUnknownKey, Reason: reason})
			continue
		}
		if val == nil {
			continue // "bounce:" with nothing under it
		}
		m, ok := val.(map[string]any)
		if !ok {
			errs = append(errs, &KeyError{Key: section, Value: show(val), Source: srcOf(section), Err: ErrBadValue,
				Reason: "want a mapping of " + section + " keys: " + strings.Join(sectionKeys[section], ", ")})
			continue
		}
		m = flattenGroups(section, m, byKey)
		out := map[string]any{}
		for _, name := range slices.Sorted(maps.Keys(m)) {
			key := section + "." + name
			v := m[name]
			f, ok := byKey[key]
			if why, gone := removedKeys()[key]; !ok && gone {
				errs = append(errs, &KeyError{Key: key, Value: show(v), Source: srcOf(key), Err: ErrUnknownKey, Reason: why})
				continue
			}
			if !ok {
				errs = append(errs, &KeyError{Key: key, Value: show(v), Source: srcOf(key), Err: ErrUnknownKey,
					Reason: "unknown key" + DidYouMean(name, sectionKeys[section]) + "; keys under " + section + ": " + strings.Join(sectionKeys[section], ", ")})
				continue
			}
			var scratch Config
			if !assign(f.ptr(&scratch), v) {
				reason := accepted(f.ptr(&scratch))
				if v == nil {
					reason = "has no value; remove the line to keep the default"
				}
				errs = append(errs, &KeyError{Key: key, Value: show(v), Source: srcOf(key), Err: ErrBadValue, Reason: reason})
				continue
			}
			if key == optionsKey {
				opts := v.(map[string]any)
				if len(opts) == 0 {
					continue
				}
				if _, bad := opts[""]; bad {
					errs = append(errs, &KeyError{Key: key, Value: show(v), Source: srcOf(key), Err: ErrBadValue, Reason: "option names must not be empty"})
					continue
				}
				for name := range opts {
					sources[optionsKey+"."+name] = srcOf(key)
				}
			}
			sources[key] = srcOf(key)
			blockKeysSet(f, v, func(k string) Source {
				if s := srcOf(k); s != "" {
					return s
				}
				return srcOf(key)
			}, sources)
			setNested(out, name, blockMapping(f, v))
		}
		if len(out) > 0 {
			clean[section] = out
		}
	}
	return clean, errs
}

// environMap turns os.Environ-style entries into a map.
func environMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, e := range environ {
		if k, v, ok := strings.Cut(e, "="); ok {
			m[k] = v
		}
	}
	return m
}

// bytesProvider is a koanf.Provider over in-memory file contents.
type bytesProvider []byte

// ReadBytes returns the contents.
func (b bytesProvider) ReadBytes() ([]byte, error) { return b, nil }

// Read is not supported; the YAML parser reads the bytes.
func (b bytesProvider) Read() (map[string]any, error) {
	return nil, errors.New("config: inline file data needs a parser")
}

// safeYAML is koanf's YAML parser with a guard that turns a parser panic on
// hostile input into an error, so Load never panics. String values have
// their ${env:NAME} references expanded from env (expandEnv).
type safeYAML struct{ env map[string]string }

// Unmarshal parses YAML into a map.
func (p safeYAML) Unmarshal(b []byte) (m map[string]any, err error) {
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("yaml parser failed: %v", r)
		}
	}()
	if m, err = yaml.Parser().Unmarshal(b); err != nil {
		return nil, err
	}
	if _, err := expandTree(m, "", p.env); err != nil {
		return nil, err
	}
	return m, nil
}

// Marshal renders a map as YAML.
func (safeYAML) Marshal(m map[string]any) ([]byte, error) { return yaml.Parser().Marshal(m) }
