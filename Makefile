# bounce — see README.md. `make run` and `make test` work on a fresh Debian machine.
GO        ?= $(shell command -v go || echo /usr/local/go/bin/go)
PKGS      ?= ./...
BENCHTIME ?= 1x
FUZZTIME  ?= 20s

.PHONY: run test bench lint fuzz setup build clean

setup:
	./scripts/setup.sh

build: setup
	$(GO) build -o bin/bounce ./cmd/bounce

## run: the main job — two agent processes move a KV-shaped transfer, verified byte-exact
run: build
	./bin/bounce run

## test: the whole suite under the race detector
test: setup
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

## bench: Go benchmarks (ratios measured side by side in one run)
bench: setup
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) $(PKGS)

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

clean:
	rm -rf bin out
