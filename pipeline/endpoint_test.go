package pipeline

import (
	"errors"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

// TestEndpointOnHost: a WANT's endpoint is accepted for a peer whose
// descriptor was not loaded only on the host the WANT came from (a
// loopback one only from this host itself); unknown sources and endpoints
// in another form are not judged.
func TestEndpointOnHost(t *testing.T) {
	for _, c := range []struct {
		endpoint, from, self string
		ok                   bool
	}{
		{"tcp://10.0.0.5:4000", "10.0.0.5", "tcp://10.0.0.9:1", true},
		{"tcp://10.0.0.6:4000", "10.0.0.5", "tcp://10.0.0.9:1", false},
		{"tcp://127.0.0.1:4000", "127.0.0.1", "tcp://127.0.0.1:1", true},
		{"tcp://127.0.0.2:4000", "127.0.0.1", "tcp://127.0.0.1:1", false},
		{"tcp://127.0.0.1:4000", "10.0.0.9", "tcp://10.0.0.9:1", true},  // this host
		{"tcp://127.0.0.1:4000", "10.0.0.5", "tcp://10.0.0.9:1", false}, // another host's loopback
		{"tcp://[::1]:4000", "::1", "tcp://[::1]:1", true},
		{"tcp://[fd00::2]:4000", "fd00::1", "tcp://[fd00::9]:1", false},
		{"tcp://recv.example:4000", "10.0.0.5", "tcp://10.0.0.9:1", false}, // a name
		{"tcp://10.0.0.5", "10.0.0.5", "", false},                          // no port
		{"tcp://10.0.0.6:4000", "", "", true},                              // source unknown
		{"", "10.0.0.5", "", true},                                         // no endpoint: the known one
		{"nixl-metadata-blob", "10.0.0.5", "", true},                       // another form
	} {
		err := endpointOnHost(c.endpoint, c.from, c.self)
		if (err == nil) != c.ok || err != nil && !errors.Is(err, transfer.ErrBadEndpoint) {
			t.Errorf("endpointOnHost(%q, from %q, self %q) = %v, want ok %v", c.endpoint, c.from, c.self, err, c.ok)
		}
	}
}
