//go:build nixl

package nixl

// Built reports whether this build has the NIXL engine (-tags nixl).
const Built = true
