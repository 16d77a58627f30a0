// Package etcd is the etcd directory of package discovery: each agent's
// record lives under <prefix>/agents/<name> on a lease the agent keeps
// alive, so a peer that dies is gone from the directory (and forgotten by
// those who follow it) one lease after its last keep-alive. A name is
// taken with a transaction on the key's create revision, so a live agent's
// record cannot be taken over; it is free again once its lease is gone.
package etcd

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/discovery"
)

// Directory is a discovery.Directory on an etcd cluster.
type Directory struct {
	cli       *clientv3.Client
	prefix    string
	lease     time.Duration
	timeout   time.Duration
	endpoints string
	log       *slog.Logger
}

var _ discovery.Directory = (*Directory)(nil)

// InsecureWarning is the message Open logs (once, at Warn) when it accepts
// an etcd without TLS or users because of discovery.insecure.
const InsecureWarning = "discovery: etcd without TLS or authentication (discovery.insecure): anyone who can write to it chooses the records agents load; pin peer keys in security.allowed_peers"

// Open connects to the cluster cfg names and checks that it answers
// within cfg.DialTimeout: an unreachable cluster is an error wrapping
// discovery.ErrUnavailable that names the endpoints. log may be nil.
func Open(ctx context.Context, cfg config.DiscoveryConfig, log *slog.Logger) (*Directory, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	eps := cfg.EndpointList()
	if len(eps) == 0 {
		return nil, fmt.Errorf("discovery: etcd: no endpoints (discovery.endpoints)")
	}
	if !cfg.Insecure && (!cfg.TLS() || cfg.Username == "") {
		return nil, fmt.Errorf("discovery: etcd at %s: refused without TLS and authentication (discovery.tls_*, discovery.username): anyone who can write to it would choose the records agents load; set discovery.insecure true to accept that", cfg.Endpoints)
	}
	if cfg.Insecure && (!cfg.TLS() || cfg.Username == "") {
		log.Warn(InsecureWarning,
			"endpoints", cfg.Endpoints, "tls", cfg.TLS(), "auth", cfg.Username != "")
	}
	cc := clientv3.Config{
		Endpoints:   eps,
		DialTimeout: cfg.DialTimeout,
		Username:    cfg.Username,
		Logger:      zap.NewNop(),
		// Keep-alive pings notice a dead member while a watch is idle.
		DialKeepAliveTime:    cfg.DialTimeout,
		DialKeepAliveTimeout: cfg.DialTimeout,
	}
	if cfg.PasswordFile != "" {
		pw, err := os.ReadFile(cfg.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("discovery.password_file: %w", err)
		}
		cc.Password = strings.TrimRight(string(pw), "\r\n")
	}
	if cfg.TLS() {
		t, err := tlsConfig(cfg)
		if err != nil {
			return nil, err
		}
		cc.TLS = t
	}
	d := &Directory{prefix: strings.TrimSuffix(cfg.Prefix, "/"), lease: cfg.Lease, timeout: cfg.DialTimeout, endpoints: strings.Join(eps, ","), log: log}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, d.openFailed(cfg, err)
	}
	d.cli = cli
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if _, err := cli.Get(pctx, d.prefix+"/agents/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, d.unavailable("connect", err)
	}
	return d, nil
}

// openFailed explains a failed clientv3.New: with discovery.username set it
// authenticates (etcd checks the password with bcrypt, which a loaded etcd
// host may take seconds over), so a wrong password is named as such, and a
// deadline names the call and the key that bounds it instead of a bare
// "context deadline exceeded".
func (d *Directory) openFailed(cfg config.DiscoveryConfig, err error) error {
	if cfg.Username == "" {
		return d.unavailable("connect", err)
	}
	if errors.Is(err, rpctypes.ErrAuthFailed) {
		return fmt.Errorf("discovery: etcd at %s: user %q refused: check discovery.username and the password in discovery.password_file (%s): %w", d.endpoints, cfg.Username, cfg.PasswordFile, err)
	}
	return d.unavailable(fmt.Sprintf("authenticate as user %q", cfg.Username), err)
}

// tlsConfig builds the client's TLS from the PEM files cfg names.
func tlsConfig(cfg config.DiscoveryConfig) (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.TLSCA != "" {
		pem, err := os.ReadFile(cfg.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("discovery.tls_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("discovery.tls_ca %s: no PEM certificate in it", cfg.TLSCA)
		}
		t.RootCAs = pool
	}
	if cfg.TLSCert != "" {
		c, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("discovery.tls_cert/tls_key: %w", err)
		}
		t.Certificates = []tls.Certificate{c}
	}
	return t, nil
}

// unavailable wraps an etcd call's failure: a deadline or a lost
// connection is discovery.ErrUnavailable, naming the endpoints.
func (d *Directory) unavailable(op string, err error) error {
	if c := status.Code(err); errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || c == codes.Unavailable || c == codes.DeadlineExceeded {
		return fmt.Errorf("%w: etcd at %s: %s: no answer within %v (discovery.dial_timeout): %v", discovery.ErrUnavailable, d.endpoints, op, d.timeout, err)
	}
	return fmt.Errorf("discovery: etcd at %s: %s: %w", d.endpoints, op, err)
}

// NamesAgents reports true: a record's name is the agent name its
// descriptor must carry (discovery.Peers refuses one that names another).
func (d *Directory) NamesAgents() bool { return true }

// Key returns the key name's record lives under.
func (d *Directory) Key(name string) string { return d.prefix + "/agents/" + name }

func checkName(name string) error {
	if name == "" || len(name) > 255 || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("%w %q: 1..255 bytes without '/'", discovery.ErrBadName, name)
	}
	return nil
}

// call bounds one etcd call by the dial timeout.
func (d *Directory) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.timeout)
}

// Publish puts value under name on a new lease of discovery.lease and
// keeps the lease alive. A name whose key exists (a live agent's record)
// is refused with an error wrapping discovery.ErrDuplicate.
func (d *Directory) Publish(ctx context.Context, name string, value []byte) (discovery.Publication, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	p := &publication{d: d, name: name, key: d.Key(name), value: append([]byte(nil), value...), done: make(chan struct{})}
	if err := p.take(ctx); err != nil {
		return nil, err
	}
	p.wg.Add(2)
	go p.keep()
	go p.guard()
	return p, nil
}

// Lookup returns name's record.
func (d *Directory) Lookup(ctx context.Context, name string) (discovery.Record, error) {
	if err := checkName(name); err != nil {
		return discovery.Record{}, err
	}
	cctx, cancel := d.call(ctx)
	defer cancel()
	resp, err := d.cli.Get(cctx, d.Key(name))
	if err != nil {
		return discovery.Record{}, d.unavailable("look up "+name, err)
	}
	if len(resp.Kvs) == 0 {
		return discovery.Record{}, fmt.Errorf("%w: %q under %s", discovery.ErrNotFound, name, d.prefix+"/agents/")
	}
	kv := resp.Kvs[0]
	if kv.Lease == 0 {
		return discovery.Record{}, d.leaseless(name)
	}
	return discovery.Record{Name: name, Value: kv.Value, Version: kv.ModRevision}, nil
}

// leaseless is the refusal of a record without a lease: every agent
// publishes on one, so such a record was written by someone else (it
// would never expire).
func (d *Directory) leaseless(name string) error {
	d.log.Warn("discovery: etcd record without a lease refused: not published by an agent", "peer", name, "key", d.Key(name))
	return fmt.Errorf("%w: %q at %s has no lease (every agent publishes on one): %w", discovery.ErrNotFound, name, d.Key(name), discovery.ErrRefused)
}

// Watch reports name's current record and its changes. It keeps watching
// through outages of the cluster (the changes missed are reported when it
// answers again); the channel closes when ctx ends.
func (d *Directory) Watch(ctx context.Context, name string) (<-chan discovery.Event, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	out := make(chan discovery.Event, 16)
	go d.watch(ctx, name, out)
	return out, nil
}

func (d *Directory) watch(ctx context.Context, name string, out chan<- discovery.Event) {
	defer close(out)
	key := d.Key(name)
	send := func(ev discovery.Event) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	retry := 100 * time.Millisecond
	for ctx.Err() == nil {
		cctx, cancel := d.call(ctx)
		resp, err := d.cli.Get(cctx, key)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.log.Warn("discovery: etcd watch: get failed; retrying", "peer", name, "err", err)
			select {
			case <-time.After(retry):
			case <-ctx.Done():
				return
			}
			retry = min(2*retry, 2*time.Second)
			continue
		}
		retry = 100 * time.Millisecond
		ev := discovery.Event{Gone: true, Record: discovery.Record{Name: name}}
		if len(resp.Kvs) > 0 {
			if kv := resp.Kvs[0]; kv.Lease != 0 {
				ev = discovery.Event{Record: discovery.Record{Name: name, Value: kv.Value, Version: kv.ModRevision}}
			} else {
				_ = d.leaseless(name) // reported as gone
			}
		}
		if !send(ev) {
			return
		}
		wctx, wcancel := context.WithCancel(ctx)
		for wr := range d.cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1)) {
			if err := wr.Err(); err != nil {
				// Compacted past our revision, or cancelled: read the
				// key again and watch from there.
				d.log.Warn("discovery: etcd watch restarted", "peer", name, "err", err)
				break
			}
			for _, e := range wr.Events {
				ev := discovery.Event{Gone: true, Record: discovery.Record{Name: name}}
				switch {
				case e.Type == mvccpb.PUT && e.Kv.Lease != 0:
					ev = discovery.Event{Record: discovery.Record{Name: name, Value: e.Kv.Value, Version: e.Kv.ModRevision}}
				case e.Type == mvccpb.PUT:
					_ = d.leaseless(name) // reported as gone: the peer is forgotten
				}
				if !send(ev) {
					wcancel()
					return
				}
			}
		}
		wcancel()
	}
}

// Close closes the client: publications stop being kept alive (their
// records go when their leases expire).
func (d *Directory) Close() error { return d.cli.Close() }

// publication is one record on its lease, kept alive by keep.
type publication struct {
	d    *Directory
	name string
	key  string

	mu    sync.Mutex
	value []byte
	lease clientv3.LeaseID

	done   chan struct{}
	closed sync.Once
	wg     sync.WaitGroup
}

// take grants a lease and puts the record on it if the key is absent.
func (p *publication) take(ctx context.Context) error {
	d := p.d
	cctx, cancel := d.call(ctx)
	defer cancel()
	g, err := d.cli.Grant(cctx, int64(d.lease/time.Second))
	if err != nil {
		return d.unavailable("grant lease for "+p.name, err)
	}
	p.mu.Lock()
	value := p.value
	p.mu.Unlock()
	resp, err := d.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.CreateRevision(p.key), "=", 0)).
		Then(clientv3.OpPut(p.key, string(value), clientv3.WithLease(g.ID))).
		Else(clientv3.OpGet(p.key)).
		Commit()
	if err != nil {
		_, _ = d.cli.Revoke(context.WithoutCancel(cctx), g.ID)
		return d.unavailable("publish "+p.name, err)
	}
	if !resp.Succeeded {
		if rs := resp.Responses; len(rs) > 0 && len(rs[0].GetResponseRange().Kvs) > 0 {
			// A record without a lease is no live agent's (it would
			// never expire and keep the name from its agent forever):
			// it is replaced.
			if kv := rs[0].GetResponseRange().Kvs[0]; kv.Lease == 0 {
				d.log.Warn("discovery: etcd record without a lease under this agent's name replaced: not published by an agent", "name", p.name, "key", p.key)
				r2, err := d.cli.Txn(cctx).
					If(clientv3.Compare(clientv3.ModRevision(p.key), "=", kv.ModRevision)).
					Then(clientv3.OpPut(p.key, string(value), clientv3.WithLease(g.ID))).
					Commit()
				if err == nil && r2.Succeeded {
					resp.Succeeded = true
				}
			}
		}
	}
	if !resp.Succeeded {
		_, _ = d.cli.Revoke(cctx, g.ID)
		holder := ""
		if rs := resp.Responses; len(rs) > 0 && len(rs[0].GetResponseRange().Kvs) > 0 {
			kv := rs[0].GetResponseRange().Kvs[0]
			if kv.Lease != 0 {
				if ttl, err := d.cli.TimeToLive(cctx, clientv3.LeaseID(kv.Lease)); err == nil && ttl.TTL > 0 {
					holder = fmt.Sprintf(" (its lease expires in %ds unless kept alive)", ttl.TTL)
				}
			}
		}
		return fmt.Errorf("%w: %q at %s%s; choose another agent.name or stop the agent that holds it", discovery.ErrDuplicate, p.name, p.key, holder)
	}
	if want := int64(d.lease / time.Second); g.TTL != want {
		// etcd raises a lease below its minimum (3 election timeouts'
		// worth of heartbeats, 3s by default) to that minimum.
		d.log.Info("discovery: etcd granted another lease TTL", "name", p.name, "asked_s", want, "granted_s", g.TTL)
	}
	p.mu.Lock()
	p.lease = g.ID
	p.mu.Unlock()
	return nil
}

// untilDone returns a context cancelled once the publication is done (or
// by cancel, which the caller defers).
func (p *publication) untilDone() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// keep keeps the lease alive; when it is lost (the cluster unreachable for
// a whole lease), it takes the name again once the cluster answers.
func (p *publication) keep() {
	defer p.wg.Done()
	ctx, cancel := p.untilDone()
	defer cancel()
	for ctx.Err() == nil {
		p.mu.Lock()
		id := p.lease
		p.mu.Unlock()
		if id != 0 {
			ka, err := p.d.cli.KeepAlive(ctx, id)
			if err == nil {
				for range ka {
				}
			}
			if ctx.Err() != nil {
				return
			}
			p.d.log.Warn("discovery: lease lost; publishing again", "name", p.name, "err", err)
			p.mu.Lock()
			p.lease = 0
			p.mu.Unlock()
		}
		select {
		case <-time.After(p.d.lease / 4):
		case <-ctx.Done():
			return
		}
		if err := p.take(ctx); err != nil {
			p.d.log.Warn("discovery: publish again", "name", p.name, "err", err)
		}
	}
}

// guard watches the agent's own record: when someone else deletes it or
// puts another value or lease under its key (anyone who can write to the
// prefix can), it warns and publishes the agent's record again, so peers
// following the name are not left without it or with a forged one.
func (p *publication) guard() {
	defer p.wg.Done()
	ctx, cancel := p.untilDone()
	defer cancel()
	for ctx.Err() == nil {
		for wr := range p.d.cli.Watch(ctx, p.key) {
			if wr.Err() != nil {
				break
			}
			for _, e := range wr.Events {
				p.mu.Lock()
				id, value := p.lease, p.value
				p.mu.Unlock()
				if id == 0 || ctx.Err() != nil {
					continue // keep is taking the name again
				}
				what := "deleted"
				if e.Type == mvccpb.PUT {
					if clientv3.LeaseID(e.Kv.Lease) == id && bytes.Equal(e.Kv.Value, value) {
						continue // this agent's own put
					}
					what = fmt.Sprintf("overwritten (lease %x, %d bytes)", e.Kv.Lease, len(e.Kv.Value))
				}
				p.d.log.Warn("discovery: this agent's etcd record was "+what+" by someone else; publishing it again", "name", p.name, "key", p.key)
				cctx, ccancel := p.d.call(ctx)
				_, err := p.d.cli.Put(cctx, p.key, string(value), clientv3.WithLease(id))
				ccancel()
				if err != nil && ctx.Err() == nil {
					p.d.log.Warn("discovery: publish again", "name", p.name, "err", err)
				}
			}
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// Update puts value on the record's lease, if the record is still ours.
func (p *publication) Update(ctx context.Context, value []byte) error {
	p.mu.Lock()
	p.value = append([]byte(nil), value...)
	id := p.lease
	p.mu.Unlock()
	if id == 0 {
		return fmt.Errorf("discovery: update %q: lease lost; it is published again when etcd answers", p.name)
	}
	cctx, cancel := p.d.call(ctx)
	defer cancel()
	resp, err := p.d.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.LeaseValue(p.key), "=", id)).
		Then(clientv3.OpPut(p.key, string(value), clientv3.WithLease(id))).
		Commit()
	if err != nil {
		return p.d.unavailable("update "+p.name, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("discovery: update %q: the record is no longer this agent's (its lease expired)", p.name)
	}
	return nil
}

// Close revokes the lease, which deletes the record at once.
func (p *publication) Close(ctx context.Context) error {
	var err error
	p.closed.Do(func() {
		close(p.done)
		p.wg.Wait()
		p.mu.Lock()
		id := p.lease
		p.mu.Unlock()
		if id == 0 {
			return
		}
		cctx, cancel := p.d.call(ctx)
		defer cancel()
		if _, rerr := p.d.cli.Revoke(cctx, id); rerr != nil {
			err = p.d.unavailable("withdraw "+p.name, rerr)
		}
	})
	return err
}
