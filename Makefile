# idem — `make help` lists the targets.

GO        ?= go
GOBIN     := $(CURDIR)/bin
LINT      := $(GOBIN)/golangci-lint
LINT_VER  := v2.15.0
FUZZTIME  ?= 30s

# The repository's Go modules: the root module, the nested ones that keep
# heavy dependencies away from the core's users, and tools (benchmarks, load
# and crash drivers, the mutation runner). test, vet, fmt-check, tidy-check,
# check-modules, lint and fuzz run in each.
MODULES   := . payments_example idemamqp idemclient idemgrpc idemkafka idemnats idemotel idemriver tools
# Pathspecs that leave the nested modules out of the root module's files.
NESTED_EXCLUDES := $(foreach m,$(filter-out .,$(MODULES)),':(exclude)$(m)/')

export PATH := /usr/local/go/bin:$(PATH)

.DEFAULT_GOAL := help
.PHONY: help test test-long test-tools check-modules-build test-long-suites test-linearizability check-large-files check-modules generate-check-full settle-test demo bench bench-operations bench-http loadtest crashtest failover-test partition-experiment test-pgbouncer test-citus bench-citus fuzz mutate mutate-broad lint vet fmt-check tidy-check generate generate-check generate-example generate-check-example generate-grpc generate-check-grpc bench-retention postgres brokers

help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

postgres: ## Make a PostgreSQL answer on 127.0.0.1:5432 (start or install it, and pg_partman) unless a URL is set.
	@./scripts/ensure-postgres.sh
	@./scripts/ensure-partman.sh

brokers: ## Make a RabbitMQ answer on 127.0.0.1:5672 for idemamqp's tests (start or install it) unless IDEM_TEST_AMQP_URL is set; Kafka (kfake) and NATS run inside the tests.
	@./scripts/ensure-rabbitmq.sh

# What make test runs go test -race in (scripts/test-modules.sh, three at a
# time): integration_test as two processes (the tests named by TEST_SPLIT,
# and the others; three were slower, the cores being busy), the root
# module's other packages, and every nested module's packages, but of
# tools, whose tests check the drivers rather than the library, only
# openapicheck (idemhttp's OpenAPI components); make test-tools runs the
# rest.
TEST_SPLIT := ^Test[A-H]
TEST_SPECS := .:./integration_test@$(TEST_SPLIT) .:!./integration_test $(filter-out . tools,$(MODULES)) tools:./openapicheck
# go test -parallel for make test: most tests wait on their database (each
# has one of its own) or on a timer rather than on the cores. Measured: the
# busiest test process held 30 connections, the whole of make test 55, of
# the server's 100.
TEST_PARALLEL ?= 8
TEST_JOBS ?= 3

test: postgres brokers fmt-check vet tidy-check generate-check check-large-files check-modules ## Every module's tests against a real PostgreSQL, with -race, fuzz seeds included (the long suites are make test-long); target: under 3 minutes.
	@$(GO) run ./testkit/testdb/which
	@./scripts/test-modules.sh -j $(TEST_JOBS) -p $(TEST_PARALLEL) $(foreach s,$(TEST_SPECS),'$(s)')

test-long: postgres generate-check-full check-modules-build test-tools test-long-suites test-linearizability fuzz ## The long suites that make test leaves out: the tools module's tests, IDEM_TEST_LONG=1 tests, the long linearizability run, fuzzing (FUZZTIME each), a full regeneration, every module built and linked; about 25 minutes.

test-tools: postgres ## The tests of the tools module (the load, crash and mutation drivers' checks; make test runs only its openapicheck).
	@./scripts/test-modules.sh tools

check-modules-build: ## check-modules, with every package of every module compiled and every command linked (go build ./...).
	@CHECK_MODULES_LINK=1 ./scripts/check-modules.sh $(MODULES)

test-long-suites: postgres brokers ## Only the tests gated by IDEM_TEST_LONG=1 (scripts/test-long.sh finds them): the exec-mode x isolation matrix, the full sweeps of which make test runs a part (TestVariantsLong, TestFaultWireLong, ...), the crash tests that need no root (TestSettleThroughKills, the demo's TestPlay).
	@./scripts/test-long.sh $(MODULES)

test-linearizability: postgres ## The long linearizability run: several seeds for minutes each, while backends are terminated.
	IDEM_LINEARIZABILITY=long $(GO) test -race -count=1 -run Linearizab -timeout 30m ./integration_test

check-large-files: ## Fail on any file git tracks (or would add) over 1 MB that is not generated code.
	@./scripts/check-large-files.sh

check-modules: ## Fail unless every module loads without a go.work from a clone's files (go.sum complete) and could be published (module zip checks); vet type-checks it all.
	@./scripts/check-modules.sh $(MODULES)

settle-test: postgres ## The payments example's long settlement test: SIGKILLs, a database restart (a cluster of its own; root), a faulty processor.
	cd payments_example && IDEM_SETTLE_TEST=1 $(GO) test -race -count=1 -timeout 20m -run 'TestSettleThroughKillsAndRestarts$$' -v .

demo: postgres ## The payments example: exactly-once charges through a network that loses answers, and deposits consumed once from a JetStream stream.
	cd payments_example && $(GO) run ./demo

generate: generate-example generate-grpc ## Regenerate every checked-in generated file, and record their checksums (scripts/generated.sum).
	@./scripts/generated-sum.sh record

generate-check: ## Fail if a generated file, or what it is made from, changed since make generate recorded them (no generator runs).
	@./scripts/generated-sum.sh check

generate-check-full: generate-check generate-check-example generate-check-grpc ## Regenerate into a scratch directory and fail on any difference (builds the generators).

generate-example: ## Regenerate the payments example's api package (bundled spec, oapi-codegen code) from its openapi.yaml.
	./payments_example/generate.sh

generate-check-example: ## Fail if the payments example's generated files are stale.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	./payments_example/generate.sh "$$tmp" || exit 1; \
	for f in openapi.yaml api.gen.go; do \
	  if ! cmp -s "$$tmp/$$f" payments_example/api/$$f; then \
	    echo "payments_example/api/$$f is stale: run make generate and commit the result"; \
	    diff -u payments_example/api/$$f "$$tmp/$$f" | head -n 40; exit 1; \
	  fi; \
	done

generate-grpc: ## Regenerate idemgrpc's example service from its .proto (buf and the plugins are pinned in idemgrpc/tools.mod).
	cd idemgrpc && $(GO) tool -modfile=tools.mod buf generate

generate-check-grpc: ## Fail if idemgrpc's generated code differs from a fresh generation.
	@./scripts/check-generated-grpc.sh

bench: postgres ## Benchmark idem.Do against the bare transaction, replays and the peer patterns (operations made of steps: make bench-operations).
	cd tools && $(GO) run -tags idembench ./idem-bench

bench-operations: postgres ## A charge at a slow processor (1 s, 2 s, none) in one Do, as an idem.Operation and as a DBOS Transact workflow, side by side; about 4 minutes.
	cd tools && $(GO) run -tags idembench ./idem-bench -operations

bench-http: postgres ## idemhttp vs a bare handler over HTTP (1 ms to the database), and memory per request in flight; about 70 s.
	cd tools && $(GO) run -tags idembench ./idem-bench -http

bench-retention: postgres ## Plain table + sweeper vs partitioned table + drops under sustained load (ARGS=-short for a quick run).
	cd tools && $(GO) run ./idem-retention $(ARGS)

loadtest: postgres ## Several processes, 100k+ operations, reconciled from the database.
	cd tools && $(GO) run ./idem-load

crashtest: ## Kill the services and crash PostgreSQL under retrying clients: idem-load's app, then the payments example (CRASHTEST_SERVICES; own cluster on :54329; root).
	IDEM_CRASH_SERVICES="$(CRASHTEST_SERVICES)" ./scripts/crashtest.sh $(CRASHTEST_ARGS)

failover-test: ## Promote an asynchronous standby under load (own clusters on :54330/:54331; root).
	./scripts/failover-test.sh $(FAILOVER_ARGS)

partition-experiment: ## How long PostgreSQL keeps a silent client's transaction under each setting (own cluster and netns; root).
	./scripts/partition-experiment.sh

test-citus: ## idem's contract on a running Citus cluster: IDEM_TEST_CITUS_URL names its coordinator (docs/SCALING.md); skipped, saying so, when it is not set.
	@if [ -z "$$IDEM_TEST_CITUS_URL" ]; then \
	  echo "test-citus: skipped: set IDEM_TEST_CITUS_URL to a Citus coordinator (docs/SCALING.md, Testing on your cluster)"; \
	else $(GO) test -race -count=1 -timeout 20m -v ./integration_test/citus; fi

bench-citus: ## Do against the bare transaction on a running Citus cluster, through the coordinator and through each kind of worker (IDEM_TEST_CITUS_URL).
	@if [ -z "$$IDEM_TEST_CITUS_URL" ]; then \
	  echo "bench-citus: skipped: set IDEM_TEST_CITUS_URL to a Citus coordinator (docs/SCALING.md, Testing on your cluster)"; \
	else $(GO) test -run '^$$' -bench . -benchtime 3s -count 3 ./integration_test/citus; fi

test-pgbouncer: postgres ## Run the integration suite through PgBouncer in transaction pooling mode.
	./scripts/test-pgbouncer.sh

mutate: postgres ## Put each deliberate bug of scripts/mutations/mutations.txt into a scratch copy; the tests must catch every one.
	cd tools && IDEM_TEST_LONG=1 $(GO) run ./idem-mutate -timeout 20m $(MUTATE_FLAGS)

mutate-broad: postgres ## Gremlins' generated mutations of idem's pure logic (keys, hashes, canonical JSON), in a scratch copy.
	@./scripts/mutate-broad.sh

fuzz: ## Run each fuzz target of every module for FUZZTIME (default 30s); make test runs their seed corpora only.
	@for m in $(MODULES); do (cd $$m && $(CURDIR)/scripts/fuzz.sh $(FUZZTIME)) || exit 1; done

lint: ## golangci-lint over every module, installed into ./bin on first use.
	@test -x $(LINT) || GOBIN=$(GOBIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(LINT_VER)
	@status=0; for m in $(MODULES); do echo "golangci-lint in $$m"; (cd $$m && $(LINT) run --allow-serial-runners ./...) || status=1; done; exit $$status

vet: ## go vet over every module.
	@status=0; for m in $(MODULES); do echo "go vet ./... in $$m"; (cd $$m && $(GO) vet ./...) || status=1; done; exit $$status

fmt-check: ## Fail if gofmt would change a file of any module.
	@out=$$(for m in $(MODULES); do \
	  if [ "$$m" = . ]; then files=$$(git ls-files -- '*.go' $(NESTED_EXCLUDES)); \
	  else files=$$(git ls-files -- "$$m/*.go"); fi; \
	  [ -z "$$files" ] || gofmt -l $$files; \
	done); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

tidy-check: ## Fail if go mod tidy would change go.mod or go.sum of any module.
	@for m in $(MODULES); do \
	  tmp=$$(mktemp -d); cp $$m/go.mod $$m/go.sum "$$tmp"/; \
	  (cd $$m && $(GO) mod tidy) || { rm -rf "$$tmp"; exit 1; }; \
	  if ! cmp -s $$m/go.mod "$$tmp"/go.mod || ! cmp -s $$m/go.sum "$$tmp"/go.sum; then \
	    echo "go mod tidy changed $$m/go.mod or $$m/go.sum; commit the tidy result"; \
	    cp "$$tmp"/go.mod "$$tmp"/go.sum $$m/; rm -rf "$$tmp"; exit 1; \
	  fi; \
	  rm -rf "$$tmp"; \
	done
