package zmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/bouncekv/bounce/transfer"
)

// maxEndpointLen bounds the endpoint strings AddPeer looks at.
const maxEndpointLen = 512

// hostLookup resolves a host name to addresses.
type hostLookup func(ctx context.Context, host string) ([]string, error)

// endpointHost is a syntactically valid tcp endpoint: an IP literal or a
// host name still to be resolved.
type endpointHost struct {
	host string
	ip   net.IP // nil for a host name
	port int
}

// parseEndpoint checks that s has the form tcp://host:port where host is an
// IP literal (IPv6 in brackets) or a syntactically valid host name and port
// is 1..65535. It does no lookups.
func parseEndpoint(s string) (endpointHost, error) {
	var eh endpointHost
	if len(s) > maxEndpointLen {
		return eh, fmt.Errorf("%d bytes, longer than %d", len(s), maxEndpointLen)
	}
	rest, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return eh, errors.New("want tcp://host:port")
	}
	host, portStr, err := net.SplitHostPort(rest)
	if err != nil {
		// SplitHostPort's messages ("too many colons", "missing port")
		// already say what is wrong; unbracketed IPv6 lands here.
		return eh, fmt.Errorf("want tcp://host:port (IPv6 in brackets): %w", err)
	}
	port, err := parsePort(portStr)
	if err != nil {
		return eh, err
	}
	eh.host, eh.port = host, port
	bracketed := strings.HasPrefix(rest, "[")
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsUnspecified() || ip.IsMulticast() {
			return eh, fmt.Errorf("host %s is not a unicast address", host)
		}
		if bracketed && !strings.Contains(host, ":") {
			return eh, fmt.Errorf("brackets around IPv4 address %s", host)
		}
		eh.ip = ip
		return eh, nil
	}
	if bracketed {
		return eh, fmt.Errorf("%q in brackets is not an IPv6 address", host)
	}
	if err := checkHostname(host); err != nil {
		return eh, err
	}
	return eh, nil
}

// parsePort accepts decimal 1..65535 and nothing else (no sign, no leading
// zero, no "*").
func parsePort(s string) (int, error) {
	if s == "" {
		return 0, errors.New("missing port")
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("port %q is not a decimal number", s)
		}
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("port %q has a leading zero", s)
	}
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("port %s out of range 1..65535", s)
	}
	return p, nil
}

// checkHostname checks RFC 1123 host name syntax. An all-numeric last label
// is rejected: such a name is a malformed IPv4 address, not a host name.
func checkHostname(h string) error {
	if h == "" {
		return errors.New("empty host")
	}
	if len(h) > 253 {
		return fmt.Errorf("host name of %d bytes is longer than 253", len(h))
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("host %q: label %q must be 1..63 bytes", h, l)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("host %q: label %q starts or ends with '-'", h, l)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("host %q: invalid character %q", h, c)
			}
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return fmt.Errorf("host %q is neither an IP address nor a host name", h)
	}
	return nil
}

// validateEndpoint parses s and, for a host name, checks that it resolves.
// Errors wrap transfer.ErrBadEndpoint.
func validateEndpoint(ctx context.Context, s string, lookup hostLookup) error {
	eh, err := parseEndpoint(s)
	if err != nil {
		return fmt.Errorf("endpoint %q: %v: %w", s, err, transfer.ErrBadEndpoint)
	}
	if eh.ip != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	addrs, err := lookup(ctx, eh.host)
	if err != nil {
		return fmt.Errorf("endpoint %q: resolve %q: %w: %w", s, eh.host, transfer.ErrBadEndpoint, err)
	}
	if len(addrs) == 0 {
		return fmt.Errorf("endpoint %q: %q resolves to no address: %w", s, eh.host, transfer.ErrBadEndpoint)
	}
	return nil
}
