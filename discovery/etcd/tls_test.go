package etcd_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/bouncekv/bounce/discovery/etcd"
)

// pki writes a CA and, signed by it, a server certificate for 127.0.0.1
// and a client certificate, as PEM files in dir.
func pki(t *testing.T, dir string) (ca, srvCert, srvKey, cliCert, cliKey string) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	now := time.Now()
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bounce test CA"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, name string) (string, string) {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kb)
	}
	ca = write("ca.pem", "CERTIFICATE", caDER)
	srvCert, srvKey = leaf(2, "etcd", x509.ExtKeyUsageServerAuth, "server")
	cliCert, cliKey = leaf(3, "bounce", x509.ExtKeyUsageClientAuth, "client")
	return
}

// TestEtcdWithTLSAndAuth: an etcd member that serves TLS only (client
// certificates required) with authentication on is used without
// discovery.insecure: the agent's directory opens with discovery.tls_*
// and discovery.username/password_file, publishes and looks up; without
// its client certificate, or with no user, it is refused.
func TestEtcdWithTLSAndAuth(t *testing.T) {
	dir := t.TempDir()
	ca, sc, sk, cc, ck := pki(t, dir)
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "data")
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	tlsURL := url.URL{Scheme: "https", Host: "127.0.0.1:0"}
	peerURL := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{tlsURL}, []url.URL{tlsURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ClientTLSInfo = transport.TLSInfo{CertFile: sc, KeyFile: sk, TrustedCAFile: ca, ClientCertAuth: true}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		t.Fatal("etcd not ready")
	}
	endpoint := "https://" + e.Clients[0].Addr().String()
	tc, err := transport.TLSInfo{CertFile: cc, KeyFile: ck, TrustedCAFile: ca}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: tc, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx := context.Background()
	for _, step := range []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "s3cret"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	pw := filepath.Join(dir, "pw")
	os.WriteFile(pw, []byte("s3cret\n"), 0o600)
	c := cfgFor(endpoint)
	c.Insecure = false
	c.DialTimeout = 30 * time.Second // bcrypt under -race on a loaded box
	c.TLSCA, c.TLSCert, c.TLSKey, c.Username, c.PasswordFile = ca, cc, ck, "root", pw
	if err := c.Validate(); err != nil {
		t.Fatalf("TLS and auth do not validate without discovery.insecure: %v", err)
	}
	d, err := etcd.Open(ctx, c, nil)
	if err != nil {
		t.Fatalf("open with TLS and auth: %v", err)
	}
	defer d.Close()
	pub, err := d.Publish(ctx, "decode-0", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	if rec, err := d.Lookup(ctx, "decode-0"); err != nil || string(rec.Value) != "x" {
		t.Fatalf("lookup over TLS: %q, %v", rec.Value, err)
	}
	noCert := c
	noCert.TLSCert, noCert.TLSKey, noCert.DialTimeout = "", "", 2*time.Second
	if d2, err := etcd.Open(ctx, noCert, nil); err == nil {
		d2.Close()
		t.Fatal("opened without the client certificate the member requires")
	}
	noUser := c
	noUser.Username, noUser.PasswordFile = "", ""
	if d3, err := etcd.Open(ctx, noUser, nil); err == nil {
		d3.Close()
		t.Fatal("opened without a user and without discovery.insecure")
	}
}
