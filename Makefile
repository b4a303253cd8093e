# The targets are the commands the README and docs/development.md show.
# `make` alone lists them.

# staticcheck's version is pinned once, in .ci/run.
STATICCHECK := $(shell sed -n 's/^STATICCHECK=//p' .ci/run)
# Every package of every module in go.work (./... is the core module's alone).
PKGS := github.com/oncehq/once/...
FUZZTIME ?= 30s

.DEFAULT_GOAL := help
.PHONY: help test bench fuzz lint ci

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z]+:.*## / {printf "  make %-6s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

test: ## every test, with the race detector (PostgreSQL on 127.0.0.1:5432; see docs/development.md)
	go test -race -count=1 -timeout 20m $(PKGS)

bench: ## the benchmarks of both stores: a new intent and a replayed duplicate
	go test -run '^$$' -bench . ./postgres/ ./sqlite/

fuzz: ## fuzz the key encoding for FUZZTIME (default 30s)
	go test -run '^$$' -fuzz FuzzKey -fuzztime $(FUZZTIME) .

lint: ## go vet, gofmt, staticcheck, go mod tidy -diff in every module, scripts/core-deps.sh
	go vet $(PKGS)
	@test -z "$$(gofmt -l .)" || { echo "gofmt would change:"; gofmt -l .; exit 1; }
	go run $(STATICCHECK) $(PKGS)
	@for mod in $$(go list -m -f '{{.Dir}}') "$(CURDIR)/bench/peers"; do \
	  (cd "$$mod" && go mod tidy -diff) || { echo "go mod tidy would change $$mod"; exit 1; }; \
	done
	(cd bench/peers && go vet ./...)
	bash scripts/core-deps.sh

ci: ## what CI runs: start PostgreSQL, install Chromium if missing, lint, then every test
	bash .ci/run
