package config

import (
	"fmt"
	"net/url"
	"strings"
	"time"
)

// DiscoveryConfig says how agents find each other (package discovery): by
// descriptor files (kind file, the default: serve --descriptor-out, send
// --peer FILE) or through an etcd cluster (kind etcd), where each agent
// publishes its descriptor under <prefix>/agents/<name> with a lease it
// keeps alive.
type DiscoveryConfig struct {
	// Kind is file or etcd (discovery.kind, default file).
	Kind string
	// Endpoints are the etcd members, comma-separated host:port or
	// http(s):// URLs (discovery.endpoints, default 127.0.0.1:2379, what
	// `make etcd` serves).
	Endpoints string
	// Prefix roots every key this cluster of agents uses
	// (discovery.prefix, default /bounce).
	Prefix string
	// Lease is the TTL of an agent's record: a peer that stops keeping it
	// alive is forgotten this long after (discovery.lease, default 10s,
	// whole seconds, 2s..1h).
	Lease time.Duration
	// DialTimeout bounds connecting to etcd at start and each etcd call
	// (discovery.dial_timeout, default 5s, 100ms..10m).
	DialTimeout time.Duration
	// Username authenticates to etcd with the password held in
	// PasswordFile (discovery.username, discovery.password_file; a file, so
	// that the secret is in no configuration dump, flag or bench report).
	Username     string
	PasswordFile string
	// TLSCA, TLSCert and TLSKey are PEM files for TLS to etcd: the CA that
	// signs the members' certificates, and a client certificate and key
	// (discovery.tls_ca, discovery.tls_cert, discovery.tls_key). Any of them
	// set turns TLS on; cert and key go together.
	TLSCA   string
	TLSCert string
	TLSKey  string
	// Insecure accepts an etcd reached without TLS or without
	// authentication (discovery.insecure, default false): whoever can
	// write to the prefix then chooses the records agents load (pin the
	// peers' keys in security.allowed_peers to keep them from choosing
	// the keys too). Without it, kind etcd needs TLS (a tls_* file) and a
	// user (discovery.username with discovery.password_file).
	Insecure bool
}

// defaultDiscovery is the one source of the discovery defaults.
func defaultDiscovery() DiscoveryConfig {
	return DiscoveryConfig{Kind: "file", Endpoints: "127.0.0.1:2379", Prefix: "/bounce", Lease: 10 * time.Second, DialTimeout: 5 * time.Second}
}

// EndpointList returns Endpoints split at commas, blanks dropped.
func (d DiscoveryConfig) EndpointList() []string {
	var out []string
	for _, e := range strings.Split(d.Endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// TLS reports whether any TLS file is set.
func (d DiscoveryConfig) TLS() bool { return d.TLSCA != "" || d.TLSCert != "" || d.TLSKey != "" }

// Validate checks the discovery settings.
func (d *DiscoveryConfig) Validate() error { return joinKeyErrors(d.validate()) }

func (d *DiscoveryConfig) validate() []*KeyError {
	var errs fieldErrors
	add := errs.add
	add(oneOf("discovery.kind", d.Kind, "file", "etcd"))
	if d.Kind == "etcd" && len(d.EndpointList()) == 0 {
		add(outOfRange("discovery.endpoints", d.Endpoints, "must name at least one etcd member (host:port or http(s)://host:port, comma-separated) with discovery.kind etcd"))
	}
	for _, e := range d.EndpointList() {
		if err := checkEndpoint(e); err != nil {
			add(outOfRange("discovery.endpoints", d.Endpoints, "member %q: %v", e, err))
		}
	}
	switch {
	case d.Prefix == "" || d.Prefix[0] != '/':
		add(outOfRange("discovery.prefix", d.Prefix, "must start with '/'"))
	case strings.HasSuffix(d.Prefix, "/") && d.Prefix != "/":
		add(outOfRange("discovery.prefix", d.Prefix, "must not end with '/'"))
	case strings.ContainsFunc(d.Prefix, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		add(outOfRange("discovery.prefix", d.Prefix, "must not contain spaces or control characters"))
	}
	switch {
	case d.Lease < 2*time.Second || d.Lease > time.Hour:
		add(outOfRange("discovery.lease", d.Lease, "must be between 2s and 1h"))
	case d.Lease%time.Second != 0:
		add(outOfRange("discovery.lease", d.Lease, "must be whole seconds (etcd leases count seconds)"))
	}
	if d.DialTimeout < 100*time.Millisecond || d.DialTimeout > 10*time.Minute {
		add(outOfRange("discovery.dial_timeout", d.DialTimeout, "must be between 100ms and 10m"))
	}
	if (d.TLSCert == "") != (d.TLSKey == "") {
		add(outOfRange("discovery.tls_cert", d.TLSCert, "discovery.tls_cert and discovery.tls_key go together (tls_key is %q)", d.TLSKey))
	}
	if d.Kind == "etcd" && !d.Insecure && (!d.TLS() || d.Username == "") {
		var missing []string
		if !d.TLS() {
			missing = append(missing, "TLS (discovery.tls_ca, tls_cert, tls_key)")
		}
		if d.Username == "" {
			missing = append(missing, "authentication (discovery.username, password_file)")
		}
		add(outOfRange("discovery.insecure", d.Insecure, "etcd without %s lets anyone who can reach it write the records agents load: configure them, or set discovery.insecure true to accept that (pin peer keys in security.allowed_peers)", strings.Join(missing, " and ")))
	}
	if (d.PasswordFile != "") != (d.Username != "") {
		add(outOfRange("discovery.password_file", d.PasswordFile, "discovery.username and discovery.password_file go together (username is %q)", d.Username))
	}
	return errs
}

// checkEndpoint accepts host:port or an http(s) URL with a host.
func checkEndpoint(e string) error {
	if strings.Contains(e, "://") {
		u, err := url.Parse(e)
		if err != nil {
			return err
		}
		if u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "unix" && u.Scheme != "unixs" {
			return fmt.Errorf("scheme %q: accepted: http, https, unix, unixs", u.Scheme)
		}
		if u.Host == "" && u.Path == "" {
			return fmt.Errorf("no host")
		}
		return nil
	}
	i := strings.LastIndexByte(e, ':')
	if i <= 0 || i == len(e)-1 {
		return fmt.Errorf("want host:port")
	}
	return nil
}
