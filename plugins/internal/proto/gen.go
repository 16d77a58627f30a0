// Package proto holds the generated gRPC code of the bounce plugin protocol.
// Regenerate with `go generate ./plugins/internal/proto` (needs protoc,
// protoc-gen-go and protoc-gen-go-grpc on PATH; see docs/PLUGINS.md).
package proto

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative,require_unimplemented_servers=false plugin.proto
