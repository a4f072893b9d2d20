package e2b

// The envd protocol's Go code is generated from proto/ and committed, so
// building needs no protoc. To regenerate (protoc from Debian's
// protobuf-compiler, the plugins pinned to go.mod's versions):
//
//	GOBIN=/tmp/protobin go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.9
//	GOBIN=/tmp/protobin go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.19.1
//	go generate ./server/e2b/
//
//go:generate sh -c "PATH=/tmp/protobin:$PATH protoc -I proto --go_out=envdpb --go_opt=paths=source_relative --connect-go_out=envdpb --connect-go_opt=paths=source_relative process/process.proto filesystem/filesystem.proto"
