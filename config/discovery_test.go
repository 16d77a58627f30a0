package config

import (
	"strings"
	"testing"
	"time"
)

func TestDiscoveryDefaultsValidate(t *testing.T) {
	d := Default().Discovery
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if d.Kind != "file" || d.Prefix != "/bounce" || d.Lease != 10*time.Second {
		t.Fatalf("defaults %+v", d)
	}
	d.Kind = "etcd"
	err := d.Validate()
	if err == nil || !strings.Contains(err.Error(), "discovery.insecure") || !strings.Contains(err.Error(), "TLS") || !strings.Contains(err.Error(), "authentication") {
		t.Fatalf("etcd without TLS and auth: %v, want a discovery.insecure key error naming both", err)
	}
	d.Insecure = true
	if err := d.Validate(); err != nil {
		t.Fatalf("etcd with the default endpoint, insecure: %v", err)
	}
	d.Insecure, d.TLSCA, d.Username, d.PasswordFile = false, "ca.pem", "bounce", "pw"
	if err := d.Validate(); err != nil {
		t.Fatalf("etcd with TLS and auth: %v", err)
	}
}

func TestDiscoveryBadValuesNameTheKey(t *testing.T) {
	for _, c := range []struct {
		key string
		set func(*DiscoveryConfig)
	}{
		{"discovery.kind", func(d *DiscoveryConfig) { d.Kind = "consul" }},
		{"discovery.endpoints", func(d *DiscoveryConfig) { d.Kind, d.Endpoints = "etcd", " , " }},
		{"discovery.endpoints", func(d *DiscoveryConfig) { d.Endpoints = "localhost" }},
		{"discovery.endpoints", func(d *DiscoveryConfig) { d.Endpoints = "ftp://h:1" }},
		{"discovery.prefix", func(d *DiscoveryConfig) { d.Prefix = "bounce" }},
		{"discovery.prefix", func(d *DiscoveryConfig) { d.Prefix = "/bounce/" }},
		{"discovery.lease", func(d *DiscoveryConfig) { d.Lease = time.Second }},
		{"discovery.lease", func(d *DiscoveryConfig) { d.Lease = 2500 * time.Millisecond }},
		{"discovery.dial_timeout", func(d *DiscoveryConfig) { d.DialTimeout = 0 }},
		{"discovery.tls_cert", func(d *DiscoveryConfig) { d.TLSCert = "c.pem" }},
		{"discovery.password_file", func(d *DiscoveryConfig) { d.PasswordFile = "pw" }},
		{"discovery.password_file", func(d *DiscoveryConfig) { d.Username = "bounce" }},
	} {
		d := Default().Discovery
		c.set(&d)
		findKeyError(t, d.Validate(), c.key, ErrOutOfRange)
	}
}

func TestDiscoveryEndpointList(t *testing.T) {
	d := DiscoveryConfig{Endpoints: " 10.0.0.1:2379,,https://e:2379 "}
	got := d.EndpointList()
	if len(got) != 2 || got[0] != "10.0.0.1:2379" || got[1] != "https://e:2379" {
		t.Fatalf("EndpointList = %q", got)
	}
}
