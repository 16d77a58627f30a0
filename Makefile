# bounce — see README.md. `make run` and `make test` work on a fresh Debian machine.
GO        ?= $(shell command -v go || echo /usr/local/go/bin/go)
PKGS      ?= ./...
BENCHTIME ?= 1x
FUZZTIME  ?= 20s

# Jaeger (tools/jaeger: a module of its own, with Jaeger as a Go tool).
JAEGER    ?= bin/jaeger

.PHONY: run test bench lint fuzz sim soak setup build clean jaeger jaeger-bin ptx nixl-check etcd route-check capi python-test python-example python-pull-example

setup:
	./scripts/setup.sh

build: setup
	$(GO) build -ldflags "-X main.linkedCommit=$$(git rev-parse HEAD 2>/dev/null)$$(git diff --quiet HEAD 2>/dev/null || echo -modified)" -o bin/bounce ./cmd/bounce

## run: the main job — two agent processes move a KV-shaped transfer, verified byte-exact
run: build
	./bin/bounce run

## test: the whole suite under the race detector (builds Jaeger first, for
## the end-to-end trace test), then the Python package's tests over libbounce.so
test: setup jaeger-bin
	$(GO) vet $(PKGS)
	JAEGER_BINARY=$(abspath $(JAEGER)) $(GO) test -race -count=1 -timeout 20m $(PKGS)
	$(MAKE) python-test

## capi: the C ABI, bin/libbounce.so and cgo's bin/libbounce.h (capi/bounce.h is the documented header)
capi: setup
	$(GO) build -buildmode=c-shared -o bin/libbounce.so ./capi

## python-test: the Python package's tests (Debian's python3, pytest and numpy)
PYTHON ?= /usr/bin/python3
python-test: capi
	cd python && $(PYTHON) -m pytest -q tests

## python-example: two Python processes, prefill and decode, move one request's KV blocks by id
python-example: capi
	$(PYTHON) python/examples/kv_connector.py

## python-pull-example: the same two processes, decode pulling the request's blocks by id when it is ready
python-pull-example: capi
	$(PYTHON) python/examples/kv_pull.py

## jaeger: a real Jaeger on 127.0.0.1 (OTLP 4317/4318, UI and API on
## http://127.0.0.1:16686), spans in memory; the first build takes minutes
jaeger: jaeger-bin
	./$(JAEGER) --config tools/jaeger/loopback.yaml

jaeger-bin: $(JAEGER)

## etcd: a real etcd (Debian etcd-server) on 127.0.0.1:2379, the default
## discovery.endpoints, data in out/etcd; for discovery.kind etcd. It has
## no TLS and no users: agents use it only with discovery.insecure true
etcd: setup
	mkdir -p out/etcd
	etcd --name bounce --data-dir out/etcd \
	  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
	  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
	  --initial-cluster bounce=http://127.0.0.1:2380

$(JAEGER): tools/jaeger/go.mod tools/jaeger/go.sum
	cd tools/jaeger && $(GO) build -o $(abspath $(JAEGER)) github.com/jaegertracing/jaeger/cmd/jaeger

## bench: Go benchmarks (ratios measured side by side in one run)
bench: setup
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) $(PKGS)

## nixl-check: the NIXL engine's tagged tests, conformance and bench; needs a
## NIXL install at NIXL_PREFIX (headers in include/, libraries and plugins/
## in NIXL_LIBDIR); see docs/NIXL.md
NIXL_PREFIX ?= /opt/nixl
NIXL_LIBDIR ?= $(firstword $(wildcard $(NIXL_PREFIX)/lib/x86_64-linux-gnu $(NIXL_PREFIX)/lib64) $(NIXL_PREFIX)/lib)
NIXL_ENV     = CGO_CFLAGS="-I$(NIXL_PREFIX)/include" CGO_CXXFLAGS="-I$(NIXL_PREFIX)/include" \
               CGO_LDFLAGS="-L$(NIXL_LIBDIR) -Wl,-rpath,$(NIXL_LIBDIR)" \
               LD_LIBRARY_PATH="$(NIXL_LIBDIR)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" \
               NIXL_PLUGIN_DIR="$(NIXL_LIBDIR)/plugins"
NIXL_BENCH  ?= --workload llama70b-tp8-b16,gptoss120b-tp8-b16 --concurrency 1 --routes bounce,direct,bulk --repeat 3
nixl-check: setup
	@test -f $(NIXL_PREFIX)/include/nixl.h || { echo "no NIXL at NIXL_PREFIX=$(NIXL_PREFIX) (want $(NIXL_PREFIX)/include/nixl.h); see docs/NIXL.md"; exit 2; }
	$(NIXL_ENV) $(GO) vet -tags nixl ./engines/nixl/ ./node/ ./certify/ ./pipeline/
	$(NIXL_ENV) $(GO) test -tags nixl -race -count=1 ./engines/nixl/ ./node/ ./certify/
	$(NIXL_ENV) $(GO) test -tags nixl -race -count=1 -run 'NIXL|DenseFragmented' ./pipeline/
	$(NIXL_ENV) $(GO) build -tags nixl -o bin/bounce-nixl ./cmd/bounce
	$(NIXL_ENV) ./bin/bounce-nixl conformance engine --builtin nixl
	$(NIXL_ENV) ./bin/bounce-nixl conformance writer --builtin nixl
	$(NIXL_ENV) ./bin/bounce-nixl conformance control --builtin nixlnotif --carrier nixl
	$(NIXL_ENV) ./bin/bounce-nixl bench --engine.kind nixl --control-plane.kind zmq $(NIXL_BENCH)
	$(NIXL_ENV) ./bin/bounce-nixl bench --engine.kind nixl --control-plane.kind nixlnotif $(NIXL_BENCH)

## route-check: route auto against bounce and direct, side by side in one run
## (the three rotated within each iteration), on every TP=8 preset and each
## engine of ROUTE_ENGINES; the summary judges per cell whether auto took the
## faster path beyond the noise band (a bootstrap interval of the median
## per-iteration bounce/direct ratio) and tallies the cells. ROUTE_BIN runs
## another build (bin/bounce-nixl for ROUTE_ENGINES=nixl, built by nixl-check;
## NIXL_PREFIX as there).
ROUTE_ENGINES ?= tcp ucx
ROUTE_PRESETS ?= llama70b-tp8-b16,llama70b-tp8-b32,llama70b-tp8-b64,gptoss120b-tp8-b16,gptoss120b-tp8-b32,gptoss120b-tp8-b64
ROUTE_FLAGS   ?= --repeat 9
ROUTE_BIN     ?= ./bin/bounce
route-check: build
	@for e in $(ROUTE_ENGINES); do \
	  echo "== engine $$e"; \
	  $(NIXL_ENV) $(ROUTE_BIN) bench --engine.kind $$e --workload $(ROUTE_PRESETS) --concurrency 1 --routes bounce,direct,auto $(ROUTE_FLAGS) || exit 1; \
	done

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet $(PKGS)

## fuzz: run every fuzz target for FUZZTIME each
fuzz:
	@for pkg in $$($(GO) list $(PKGS)); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

## ptx: regenerate the committed CUDA kernels' PTX (needs nvcc; builds use the committed file)
NVCC ?= nvcc
ptx:
	$(NVCC) -ptx -arch=compute_80 -O3 -o cuda/kernels/copy.ptx cuda/kernels/copy.cu
	$(NVCC) -ptx -arch=compute_90 -O3 -o cuda/kernels/copy_sm90.ptx cuda/kernels/copy.cu

## sim: the deterministic fault simulation for SEEDS seeds (from SEED_FIRST)
SEEDS      ?= 100000
SEED_FIRST ?= 1
sim:
	$(GO) test -count=1 -timeout 0 -run '^TestSim$$' ./pipeline -sim.seeds=$(SEEDS) -sim.first=$(SEED_FIRST) -v | grep -E '^(---|ok|FAIL)|sim:|VIOLATION|replay'

## soak: 8 senders x 128 concurrent requests (fairness, SOAK_REPEAT passes,
## failing above 1.3), then SOAK_SENDERS short-lived sender processes in
## sequence (or as many as fit in SOAK_FOR, e.g. 25m; 0 = no limit), then
## the fd/goroutine/table check; also the kill -9 tests
SOAK_SENDERS ?= 10000
SOAK_FOR     ?= 0
SOAK_REPEAT  ?= 20
soak:
	SOAK_SENDERS=$(SOAK_SENDERS) SOAK_FOR=$(SOAK_FOR) SOAK_REPEAT=$(SOAK_REPEAT) $(GO) test -count=1 -timeout 0 -run '^(TestSoak|TestKillSenderMidTransfer|TestKillReceiverMidTransfer)$$' ./cmd/bounce -v -kill.rounds=10 -soak.fairness=1.3 | grep -E '^(---|ok|FAIL)|soak:|kill -9|fairness'

clean:
	rm -rf bin out
