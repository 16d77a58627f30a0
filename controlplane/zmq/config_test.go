package zmq

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/security"
)

func TestConfigValidation(t *testing.T) {
	bad := []Config{
		{Name: ""},
		{Name: "\x00anon"},
		{Name: strings.Repeat("n", 256)},
		{Name: "a", SendHWM: -1},
		{Name: "a", RecvQueue: -1},
		{Name: "a", MaxConnsPerHost: -1},
		{Name: "a", MaxConns: -1},
		{Name: "a", BindAddress: "not-an-ip"},
		{Name: "a", BindAddress: "0.0.0.0"},
		{Name: "a", BindAddress: "::"},
		{Name: "a", BindAddress: "224.0.0.1"},
		{Name: "a", BindAddress: "[127.0.0.1"},
	}
	for _, cfg := range bad {
		c, err := New(cfg)
		if err == nil {
			c.Close()
			t.Errorf("New(%+v) succeeded, want error", cfg)
		}
	}

	got, err := Config{Name: "a"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if got.SendHWM != DefaultSendHWM || got.RecvQueue != DefaultRecvQueue || got.Logger == nil ||
		got.MaxConnsPerHost != security.DefaultMaxControlConnsPerHost || got.MaxConns != security.DefaultMaxControlConns ||
		got.MaxMessageSize != security.DefaultMaxMessageSize {
		t.Fatalf("defaults not applied: %+v", got)
	}
}

// fakeProbe is a netProbe over fixed answers that records the egress
// probes it was asked for.
type fakeProbe struct {
	ifaces   map[string][]net.Addr
	egress   map[string]net.IP // by network
	hostname string
	hostIPs  []net.IP
	probed   []string
}

func (f *fakeProbe) probe() netProbe {
	return netProbe{
		interfaceAddrs: func(name string) ([]net.Addr, error) {
			a, ok := f.ifaces[name]
			if !ok {
				return nil, errors.New("no such network interface")
			}
			return a, nil
		},
		egress: func(network, addr string) (net.IP, error) {
			f.probed = append(f.probed, network+" "+addr)
			ip, ok := f.egress[network]
			if !ok {
				return nil, errors.New("network is unreachable")
			}
			return ip, nil
		},
		hostname: func() (string, error) {
			if f.hostname == "" {
				return "", errors.New("no hostname")
			}
			return f.hostname, nil
		},
		lookupIP: func(string) ([]net.IP, error) {
			if f.hostIPs == nil {
				return nil, errors.New("no such host")
			}
			return f.hostIPs, nil
		},
	}
}

func ipnet(s string) net.Addr {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}

func TestResolveBind(t *testing.T) {
	eth := map[string][]net.Addr{
		"eth0":   {ipnet("fe80::1/64"), ipnet("10.0.0.5/24"), ipnet("10.0.0.6/24")},
		"ib0":    {ipnet("fe80::2/64"), ipnet("fd00::5/64")},
		"ll0":    {ipnet("fe80::3/64")},
		"lo":     {ipnet("127.0.0.1/8"), ipnet("::1/128")},
		"empty0": nil,
	}
	tests := []struct {
		name     string
		cfg      Config
		probe    fakeProbe
		want     string // bind endpoint; "" means an error
		errHas   string
		noEgress bool // egress must not be consulted
	}{
		{name: "explicit v4", cfg: Config{BindAddress: "10.1.2.3", Interface: "eth0"}, want: "tcp://10.1.2.3:*", noEgress: true},
		{name: "explicit loopback", cfg: Config{BindAddress: "127.0.0.1"}, want: "tcp://127.0.0.1:*", noEgress: true},
		{name: "explicit v6", cfg: Config{BindAddress: "fd00::2"}, want: "tcp://[fd00::2]:*", noEgress: true},
		{name: "explicit v6 bracketed", cfg: Config{BindAddress: "[::1]"}, want: "tcp://[::1]:*", noEgress: true},
		{name: "explicit garbage", cfg: Config{BindAddress: "eth0"}, errHas: "not an IP literal"},
		{name: "explicit unspecified", cfg: Config{BindAddress: "0.0.0.0"}, errHas: "unspecified"},
		{name: "interface first v4", cfg: Config{Interface: "eth0"}, want: "tcp://10.0.0.5:*", noEgress: true},
		{name: "interface v6 skips link-local", cfg: Config{Interface: "ib0"}, want: "tcp://[fd00::5]:*", noEgress: true},
		{name: "interface explicit loopback", cfg: Config{Interface: "lo"}, want: "tcp://127.0.0.1:*", noEgress: true},
		{name: "interface only link-local", cfg: Config{Interface: "ll0"}, errHas: "no usable"},
		{name: "interface without addresses", cfg: Config{Interface: "empty0"}, errHas: "no usable"},
		{name: "interface missing", cfg: Config{Interface: "nope0"}, errHas: `interface "nope0"`},
		{
			name:  "egress v4",
			probe: fakeProbe{egress: map[string]net.IP{"udp4": net.ParseIP("192.168.7.7"), "udp6": net.ParseIP("fd00::7")}},
			want:  "tcp://192.168.7.7:*",
		},
		{
			name:  "egress v6 when v4 is loopback",
			probe: fakeProbe{egress: map[string]net.IP{"udp4": net.ParseIP("127.0.0.1"), "udp6": net.ParseIP("fd00::7")}},
			want:  "tcp://[fd00::7]:*",
		},
		{
			name: "hostname when no egress route",
			probe: fakeProbe{hostname: "node1", hostIPs: []net.IP{
				net.ParseIP("127.0.1.1"), net.ParseIP("fd00::9"), net.ParseIP("10.2.3.4"),
			}},
			want: "tcp://10.2.3.4:*",
		},
		{
			name:  "hostname v6 only",
			probe: fakeProbe{hostname: "node1", hostIPs: []net.IP{net.ParseIP("::1"), net.ParseIP("fd00::9")}},
			want:  "tcp://[fd00::9]:*",
		},
		{
			name:   "nothing routable never falls back to loopback",
			probe:  fakeProbe{egress: map[string]net.IP{"udp4": net.ParseIP("127.0.0.1")}, hostname: "node1", hostIPs: []net.IP{net.ParseIP("127.0.1.1")}},
			errHas: "set bind_address or interface",
		},
		{name: "no network at all", errHas: "set bind_address or interface"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.probe.ifaces = eth
			ip, err := resolveBind(tc.cfg, tc.probe.probe())
			if tc.want == "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("resolveBind = %v, %v; want error containing %q", ip, err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatalf("resolveBind: %v", err)
			}
			ep, v6 := bindEndpoint(ip)
			if ep != tc.want || v6 != strings.Contains(tc.want, "[") {
				t.Fatalf("bind endpoint %q (ipv6 %v), want %q", ep, v6, tc.want)
			}
			if tc.noEgress && len(tc.probe.probed) != 0 {
				t.Fatalf("egress probed %v, want no probe", tc.probe.probed)
			}
		})
	}
}

func TestResolveBindProbesPublicAddresses(t *testing.T) {
	var f fakeProbe
	if _, err := resolveBind(Config{}, f.probe()); err == nil {
		t.Fatal("want error")
	}
	want := []string{"udp4 " + publicV4, "udp6 " + publicV6}
	if strings.Join(f.probed, ",") != strings.Join(want, ",") {
		t.Fatalf("probed %v, want %v", f.probed, want)
	}
}

func TestBindInterfaceLoopback(t *testing.T) {
	if _, err := net.InterfaceByName("lo"); err != nil {
		t.Skipf("no interface lo: %v", err)
	}
	c := newTestChannel(t, "a", func(cfg *Config) { cfg.BindAddress, cfg.Interface = "", "lo" })
	if !strings.HasPrefix(c.LocalEndpoint(), "tcp://127.0.0.1:") {
		t.Fatalf("endpoint %q, want tcp://127.0.0.1:<port>", c.LocalEndpoint())
	}
}
