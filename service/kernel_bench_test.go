package service_test

import (
	"context"
	"testing"

	"github.com/moat-sandbox/moat/service"
)

// BenchmarkKernel is issue 23 §3's code-interpreter figure on the native
// tier (root, the python image), each against a peer in the same run:
//
//   - first-cell: a new sandbox and its first cell (1+1), which starts
//     the kernel; against create-exec, a new sandbox and one command
//     (python3 -c 'print(1+1)').
//   - warm-cell: one more cell (1+1) in a kernel already running; cells
//     per second are 1e9 / ns/op. Against warm-exec, the same code as a
//     new process in the same sandbox (python3 -c), what a client without
//     a kernel pays per step.
//
// Sandbox deletion is not timed.
func BenchmarkKernel(b *testing.B) {
	s := newNativeService(b)
	ctx := context.Background()
	cell := service.CellArgs{Code: "1+1"}
	exec := service.ExecArgs{Argv: []string{"python3", "-c", "print(1+1)"}}
	check := func(b *testing.B, c service.Cell, err error) {
		if err != nil || c.Result["text/plain"] != "2" {
			b.Fatalf("cell: %v %+v", err, c)
		}
	}
	checkExec := func(b *testing.B, ex service.Exec, err error) {
		if err != nil || ex.Result == nil || ex.Result.Stdout.Data != "2\n" {
			b.Fatalf("exec: %v %+v", err, ex)
		}
	}
	fresh := func(b *testing.B) string {
		sb, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{})
		if err != nil {
			b.Fatal(err)
		}
		return sb.ID
	}
	drop := func(b *testing.B, id string) {
		b.StopTimer()
		if _, err := s.DeleteSandbox(ctx, keyA, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.Run("first-cell", func(b *testing.B) {
		for b.Loop() {
			id := fresh(b)
			c, err := s.RunCell(ctx, keyA, id, cell)
			check(b, c, err)
			drop(b, id)
		}
	})
	b.Run("create-exec", func(b *testing.B) {
		for b.Loop() {
			id := fresh(b)
			ex, err := s.RunExec(ctx, keyA, id, exec)
			checkExec(b, ex, err)
			drop(b, id)
		}
	})
	id := fresh(b)
	b.Cleanup(func() { s.DeleteSandbox(ctx, keyA, id) })
	c, err := s.RunCell(ctx, keyA, id, cell) // the kernel's start, untimed
	check(b, c, err)
	b.Run("warm-cell", func(b *testing.B) {
		for b.Loop() {
			c, err := s.RunCell(ctx, keyA, id, cell)
			check(b, c, err)
		}
	})
	b.Run("warm-exec", func(b *testing.B) {
		for b.Loop() {
			ex, err := s.RunExec(ctx, keyA, id, exec)
			checkExec(b, ex, err)
		}
	})
}
