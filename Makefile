# kvcm: `make demo` runs the main job, `make test` runs every check.
GO ?= go
GOFLAGS_TEST ?= -race -count=1

.PHONY: all demo test fmt-check vet go-test build

all: build

build:
	$(GO) build ./...

demo:
	$(GO) run ./cmd/kvcm demo

test: fmt-check vet go-test

fmt-check:
	@out="$$(gofmt -l .)"; \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

go-test:
	$(GO) test $(GOFLAGS_TEST) ./...
