# idem — `make help` lists the targets.

GO        ?= go
GOBIN     := $(CURDIR)/bin
LINT      := $(GOBIN)/golangci-lint
LINT_VER  := v2.15.0
FUZZTIME  ?= 10s

export PATH := /usr/local/go/bin:$(PATH)

.DEFAULT_GOAL := help
.PHONY: help test demo bench loadtest test-pgbouncer fuzz mutate mutate-broad lint vet fmt-check tidy-check postgres

help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

postgres: ## Make a PostgreSQL answer on 127.0.0.1:5432 (start or install it) unless a URL is set.
	@./scripts/ensure-postgres.sh

test: postgres fmt-check vet tidy-check ## Run every test against a real PostgreSQL, with -race, plus short fuzz runs.
	@$(GO) run ./internal/testdb/which
	$(GO) test -race -count=1 ./...
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZTIME)

demo: postgres ## The payments example: exactly-once charging through a network that loses answers.
	$(GO) run ./payments_example/demo

bench: postgres ## Benchmark idem.Do against the bare transaction, replays and the peer pattern.
	$(GO) run ./cmd/idem-bench

loadtest: postgres ## Several processes, 100k+ operations, reconciled from the database.
	$(GO) run ./cmd/idem-load

test-pgbouncer: postgres ## Run the integration suite through PgBouncer in transaction pooling mode.
	./scripts/test-pgbouncer.sh

mutate: postgres ## Put each deliberate bug of scripts/mutations/mutations.txt into a scratch copy; the tests must catch every one.
	$(GO) run ./cmd/idem-mutate $(MUTATE_FLAGS)

mutate-broad: postgres ## Gremlins' generated mutations of idem's pure logic (keys, hashes, canonical JSON), in a scratch copy.
	@./scripts/mutate-broad.sh

fuzz: ## Run each fuzz target for FUZZTIME (default 10s).
	@./scripts/fuzz.sh $(FUZZTIME)

lint: ## golangci-lint, installed into ./bin on first use.
	@test -x $(LINT) || GOBIN=$(GOBIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(LINT_VER)
	$(LINT) run ./...

vet: ## go vet.
	$(GO) vet ./...

fmt-check: ## Fail if gofmt would change a file.
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

tidy-check: ## Fail if go mod tidy would change go.mod or go.sum.
	@cp go.mod /tmp/idem-go.mod.bak; cp go.sum /tmp/idem-go.sum.bak; \
	$(GO) mod tidy; \
	if ! cmp -s go.mod /tmp/idem-go.mod.bak || ! cmp -s go.sum /tmp/idem-go.sum.bak; then \
	  echo "go mod tidy changed go.mod/go.sum; commit the tidy result"; \
	  cp /tmp/idem-go.mod.bak go.mod; cp /tmp/idem-go.sum.bak go.sum; exit 1; fi
