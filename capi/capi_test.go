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
