package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/pipeline/convert"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// TestCodesOfSentinels checks that every sentinel, wrapped as callers see
// it, maps to its bounce.h code, the more specific first.
func TestCodesOfSentinels(t *testing.T) {
	for _, c := range []struct {
		err  error
		code int
	}{
		{nil, codeOK},
		{invalid("x"), codeInvalid},
		{fmt.Errorf("h: %w", errBadHandle), codeBadHandle},
		{fmt.Errorf("w: %w", transfer.ErrForbidden), codeForbidden},
		{fmt.Errorf("w: %w", transfer.ErrOutOfBounds), codeOutOfBounds},
		{fmt.Errorf("s: %w: %w", pipeline.ErrBounceUnavailable, transfer.ErrUnsupported), codeRefused},
		{fmt.Errorf("r: %w", transfer.ErrNotQuiescent), codeNotQuiescent},
		{fmt.Errorf("r: %w", transfer.ErrPeerLost), codePeerLost},
		{fmt.Errorf("r: %w", transfer.ErrTimeout), codeTimeout},
		{fmt.Errorf("k: %w", &config.KeyError{Key: "a", Err: config.ErrUnknownKey}), codeInvalid},
		{fmt.Errorf("p: refused pull: %w: %w", pipeline.ErrRefused, transfer.ErrForbidden), codeForbidden},
		{fmt.Errorf("p: refused pull: %w", pipeline.ErrRefused), codeRefused},
		{fmt.Errorf("s: %w: %w", convert.ErrIncompatible, transfer.ErrUnsupported), codeIncompatibleLayout},
		{fmt.Errorf("s: %w", transfer.ErrUnsupported), codeUnsupported},
		{errors.New("something else"), codeFailed},
	} {
		if got := codeOf(c.err); got != c.code {
			t.Errorf("codeOf(%v) = %d, want %d", c.err, got, c.code)
		}
	}
}

// TestOptionsEnv turns options into the configuration's environment layer
// and refuses what is not a key.
func TestOptionsEnv(t *testing.T) {
	env, err := optionsEnv([]string{"engine.kind=tcp", " bounce.arena_size = 64MiB"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"BOUNCE_ENGINE_KIND=tcp", "BOUNCE_ARENA_SIZE= 64MiB"}
	if !slices.Equal(env, want) {
		t.Fatalf("env = %q, want %q", env, want)
	}
	if _, err := optionsEnv([]string{"engine.knd=tcp"}); !errors.Is(err, errInvalid) || !strings.Contains(err.Error(), `did you mean "engine.kind"`) {
		t.Fatalf("unknown key: %v", err)
	}
	if _, err := optionsEnv([]string{"engine.kind"}); !errors.Is(err, errInvalid) {
		t.Fatalf("no value: %v", err)
	}
}

// TestCodesMatchHeader checks that bounce.h numbers each BOUNCE_ERR_* as
// codes.go does.
func TestCodesMatchHeader(t *testing.T) {
	h, err := os.ReadFile("bounce.h")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"OK", "ERR_INVALID", "ERR_BAD_HANDLE", "ERR_UNKNOWN_PEER", "ERR_TIMEOUT", "ERR_CLOSED", "ERR_PEER_LOST",
		"ERR_OUT_OF_BOUNDS", "ERR_NOT_REGISTERED", "ERR_IN_USE", "ERR_NOT_QUIESCENT", "ERR_DEVICE_FAULT", "ERR_UNSUPPORTED",
		"ERR_FORBIDDEN", "ERR_BUSY", "ERR_REFUSED", "ERR_FAILED", "ERR_INCOMPATIBLE_LAYOUT"}
	if len(names) != codeLast+1 {
		t.Fatalf("%d names for %d codes", len(names), codeLast+1)
	}
	for code, n := range names {
		re := regexp.MustCompile(`#define BOUNCE_` + n + ` (\d+)`)
		m := re.FindSubmatch(h)
		if m == nil || string(m[1]) != fmt.Sprint(code) {
			t.Errorf("bounce.h BOUNCE_%s = %s, codes.go says %d", n, m, code)
		}
	}
}

var (
	buildOnce sync.Once
	libDir    string
	buildErr  error
)

// buildLib builds libbounce.so (and cgo's header) once per test binary.
func buildLib(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the shared library: not in -short")
	}
	buildOnce.Do(func() {
		if lib := os.Getenv("BOUNCE_LIBRARY"); lib != "" { // a library built elsewhere (the GPU machine has no Go)
			libDir = filepath.Dir(lib)
			return
		}
		libDir, buildErr = os.MkdirTemp("", "libbounce")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", filepath.Join(libDir, "libbounce.so"), ".")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build -buildmode=c-shared: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return libDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if libDir != "" && os.Getenv("BOUNCE_LIBRARY") == "" {
		os.RemoveAll(libDir)
	}
	os.Exit(code)
}

// TestGeneratedHeaderCurrent checks that the checked-in libbounce.h is what
// cgo generates from the exports today (run `make capi` and copy
// bin/libbounce.h to capi/ when an export changes).
func TestGeneratedHeaderCurrent(t *testing.T) {
	dir := buildLib(t)
	got, err := os.ReadFile(filepath.Join(dir, "libbounce.h"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("libbounce.h")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("capi/libbounce.h is stale: regenerate it (make capi && cp bin/libbounce.h capi/)")
	}
}

// TestHeaderDeclaresEveryExport checks that bounce.h declares exactly the
// functions the library exports, with the same number of parameters.
func TestHeaderDeclaresEveryExport(t *testing.T) {
	proto := regexp.MustCompile(`(?m)^(?:extern )?[a-z_0-9]+\*? ?\*?(bounce_[a-z_]+)\(([^)]*)\);`)
	params := func(file string) map[string]int {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		flat := regexp.MustCompile(`,\n\s*`).ReplaceAll(b, []byte(", "))
		out := map[string]int{}
		for _, m := range proto.FindAllSubmatch(flat, -1) {
			n := 0
			if p := strings.TrimSpace(string(m[2])); p != "" && p != "void" {
				n = strings.Count(p, ",") + 1
			}
			out[string(m[1])] = n
		}
		return out
	}
	h, g := params("bounce.h"), params("libbounce.h")
	if len(g) == 0 {
		t.Fatal("no exports found in libbounce.h")
	}
	for name, n := range g {
		if hn, ok := h[name]; !ok || hn != n {
			t.Errorf("export %s (%d parameters): bounce.h declares %d (present %v)", name, n, hn, ok)
		}
	}
	for name := range h {
		if _, ok := g[name]; !ok {
			t.Errorf("bounce.h declares %s, which the library does not export", name)
		}
	}
}

// TestCPrograms builds each C program of testdata against the library and
// runs it: two agents over tcp and ZeroMQ in each; abi.c moves 1024 blocks
// by push, pull.c pulls 1024 blocks by id and descriptors and is refused
// what the holder registered for another peer, layout.c moves a
// tensor-parallel split with NHD -> HND and is refused incompatible
// layouts; every byte checked.
func TestCPrograms(t *testing.T) {
	dir := buildLib(t)
	for _, prog := range []string{"abi", "pull", "layout"} {
		t.Run(prog, func(t *testing.T) {
			exe := filepath.Join(t.TempDir(), prog)
			cc := exec.Command("cc", "-std=c11", "-Wall", "-Werror", "-I.", "-o", exe, "testdata/"+prog+".c", "-L"+dir, "-lbounce", "-Wl,-rpath,"+dir)
			if out, err := cc.CombinedOutput(); err != nil {
				t.Fatalf("cc: %v\n%s", err, out)
			}
			out, err := exec.Command(exe).CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte(prog+".c: ok")) {
				t.Fatalf("%s: %v\n%s", prog, err, out)
			}
		})
	}
}

// TestPullLayoutGuard checks the pull's layout check: a pull between pools
// of the same layout, or where either has none, passes; layouts that
// differ are refused (convertible: unsupported by a pull; not
// convertible: incompatible, with the reason); the book follows
// registration, deregistration, reloads and forgets.
func TestPullLayoutGuard(t *testing.T) {
	nhd := transfer.Layout{Layers: 2, KV: 2, Heads: 4, HeadDim: 8, Tokens: 16, Elem: 2, Order: transfer.NHD}
	hnd, wide := nhd, nhd
	hnd.Order = transfer.HND
	wide.Heads, wide.HeadDim = 2, 16
	pool := func(l transfer.Layout) transfer.Pool {
		return transfer.Pool{Regions: make([]uint64, l.Regions()), BlockLen: l.BlockLen(), Stride: l.BlockLen(), Blocks: 8, Kind: transfer.Host}
	}
	desc := func(ls map[string]*transfer.Layout) []byte {
		d := wire.AgentDesc{Name: "holder", Engine: []byte("e")}
		for name, l := range ls {
			p := pool(nhd)
			for i := range p.Regions {
				p.Regions[i] = uint64(i+1) << 20
			}
			d.Pools = append(d.Pools, wire.PoolDesc{Name: name, Pool: p, Layout: l})
		}
		return wire.MarshalAgentDesc(d)
	}
	b := newLayoutBook()
	b.loaded("holder", desc(map[string]*transfer.Layout{"kv": &nhd, "raw": nil}))
	b.registered("same", &nhd)
	b.registered("swapped", &hnd)
	b.registered("wide", &wide)
	for _, c := range []struct {
		src, dst string
		code     int
		want     string
	}{
		{"kv", "same", codeOK, ""},
		{"kv", "none", codeOK, ""},
		{"raw", "swapped", codeOK, ""},
		{"kv", "swapped", codeUnsupported, "a pull does not convert layouts"},
		{"kv", "wide", codeIncompatibleLayout, "heads of 8 elements against 16"},
	} {
		err := b.checkPull("holder", c.src, c.dst)
		if codeOf(err) != c.code || (c.want != "" && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("pull %s -> %s: %v (code %d), want code %d saying %q", c.src, c.dst, err, codeOf(err), c.code, c.want)
		}
	}
	b.deregistered("swapped")
	if err := b.checkPull("holder", "kv", "swapped"); err != nil {
		t.Errorf("a deregistered pool's layout still judged: %v", err)
	}
	b.registered("wide", nil) // registered again without a layout
	if err := b.checkPull("holder", "kv", "wide"); err != nil {
		t.Errorf("a pool registered again without a layout still judged: %v", err)
	}
	b.registered("swapped", &hnd)
	b.loaded("holder", desc(map[string]*transfer.Layout{"kv": &hnd}))
	if err := b.checkPull("holder", "kv", "swapped"); err != nil {
		t.Errorf("a reloaded descriptor's layout not used: %v", err)
	}
	b.forgot("holder")
	if err := b.checkPull("holder", "kv", "same"); err != nil {
		t.Errorf("a forgotten peer's layout still judged: %v", err)
	}
}
