package node

import (
	"fmt"
	"slices"

	"github.com/bouncekv/bounce/config"
)

// Component is one implementation a configuration may name: its role
// (engine, control plane, gather or scatter stage), the configuration key
// that selects it, its kind, and whether this build has it (and, if not,
// why).
type Component struct {
	Role      string
	Key       string
	Kind      string
	Available bool
	Why       string // why it is unavailable; "" when available
	// NotHere says why a kind this build has cannot run on this machine
	// (the CUDA kinds without a loadable libcuda.so.1); "" when it can, or
	// when the build lacks it (Why).
	NotHere string
}

// needsCUDA says whether kind of role runs only where the CUDA driver
// loads.
func needsCUDA(role, kind string) bool {
	switch role {
	case "engine":
		return kind == "cudacopy"
	case "gather stage", "scatter stage":
		return kind == "cuda"
	}
	return false
}

// knownKinds are the kinds the configuration schema accepts per role, with
// the reason a build may lack each (used when the factory table has none).
func knownKinds() []struct {
	role, key string
	kinds     map[string]string
} {
	return []struct {
		role, key string
		kinds     map[string]string
	}{
		{"engine", "engine.kind", map[string]string{
			"loopback": "", "tcp": "", "ucx": "", "plugin": "",
			"nixl": "built without NIXL: this build has no nixl engine (it needs -tags nixl and an installed NIXL; docs/NIXL.md)",
		}},
		{"control plane", "control_plane.kind", map[string]string{"zmq": "", "nixlnotif": "", "inproc": "", "plugin": ""}},
		{"gather stage", "stages.gather", map[string]string{
			"host": "", "cuda": "this build has no CUDA gather stage", "plugin": "this build has no stage plugins",
		}},
		{"scatter stage", "stages.scatter", map[string]string{
			"host": "", "cuda": "this build has no CUDA scatter stage", "plugin": "this build has no stage plugins",
		}},
	}
}

// Components lists every kind the configuration accepts and every kind in
// f, by role and kind, saying which f can build.
func Components(f Factories) []Component {
	have := map[string]func(string) bool{
		"engine":        func(k string) bool { _, ok := f.Engines[k]; return ok },
		"control plane": func(k string) bool { _, ok := f.Controls[k]; return ok },
		"gather stage":  func(k string) bool { _, ok := f.Gatherers[k]; return ok },
		"scatter stage": func(k string) bool { _, ok := f.Scatterers[k]; return ok },
	}
	inTable := map[string][]string{
		"engine": keys(f.Engines), "control plane": keys(f.Controls),
		"gather stage": keys(f.Gatherers), "scatter stage": keys(f.Scatterers),
	}
	var out []Component
	for _, r := range knownKinds() {
		kinds := slices.Sorted(func(yield func(string) bool) {
			seen := map[string]bool{}
			for k := range r.kinds {
				seen[k] = true
				if !yield(k) {
					return
				}
			}
			for _, k := range inTable[r.role] {
				if !seen[k] && !yield(k) {
					return
				}
			}
		})
		for _, k := range kinds {
			c := Component{Role: r.role, Key: r.key, Kind: k, Available: have[r.role](k)}
			if c.Available && needsCUDA(r.role, k) && f.CUDA != nil {
				if _, err := f.CUDA.Open(); err != nil {
					c.NotHere = err.Error()
				}
			}
			if !c.Available {
				c.Why = r.kinds[k]
				if c.Why == "" {
					c.Why = "not in this build's factory table"
				}
			}
			out = append(out, c)
		}
	}
	return out
}

// CheckKinds rejects a configuration that names a kind f cannot build, with
// the key, the kind, why it is missing and what is available. A stage is
// checked only while the bounce path is enabled (it is not built
// otherwise).
func CheckKinds(cfg config.Config, f Factories) error {
	chosen := map[string]string{
		"engine.kind": cfg.Engine.Kind, "control_plane.kind": cfg.ControlPlane.Kind,
		"stages.gather": cfg.Stages.Gather.Kind, "stages.scatter": cfg.Stages.Scatter.Kind,
	}
	avail := map[string][]string{}
	var bad *Component
	for _, c := range Components(f) {
		if c.Available {
			avail[c.Key] = append(avail[c.Key], c.Kind)
		}
		if chosen[c.Key] == c.Kind && !c.Available && bad == nil {
			if c.Role == "engine" || cfg.Bounce.Enabled {
				bad = &c
			}
		}
	}
	if bad == nil {
		return nil
	}
	return fmt.Errorf("%s %q is unavailable: %s (available here: %v; see bounce components)", bad.Key, bad.Kind, bad.Why, avail[bad.Key])
}
