//go:build !nixl

package pipeline

// tagEngines returns the engines only a tagged build has (none here).
func tagEngines() []limitEngine { return nil }
