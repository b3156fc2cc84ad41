#!/bin/sh
# Regenerates the committed Go code for kvfence.transport.v1.
# Needs protoc plus protoc-gen-go and protoc-gen-go-grpc on PATH:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
# CI does not run this; the generated files are committed.
set -eu
cd "$(dirname "$0")"
PATH="$(go env GOPATH)/bin:$PATH"
protoc --proto_path=. \
  --go_out=. --go_opt=paths=source_relative \
  --go-grpc_out=. --go-grpc_opt=paths=source_relative \
  kvfence/transport/v1/transport.proto
