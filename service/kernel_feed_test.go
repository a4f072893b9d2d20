package service_test

import (
	"context"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/service"
)

// TestCellFeedInterrupt: a feed interrupts its own cell, the kernel
// keeping its state; a feed whose cell has ended interrupts nothing, not
// the next cell of its context.
func TestCellFeedInterrupt(t *testing.T) {
	restore := service.SetKernelGrace(2 * time.Second)
	t.Cleanup(restore)
	tests := []struct {
		name string
		run  func(t *testing.T, s *service.Service, id string)
	}{
		{"its own running cell", func(t *testing.T, s *service.Service, id string) {
			runCell(t, s, id, "kept = 7", 0)
			f, err := s.StartCell(t.Context(), keyA, id, service.CellArgs{Code: "import time\nprint('started', flush=True)\ntime.sleep(60)"})
			if err != nil {
				t.Fatal(err)
			}
			waitOutput(t, f)
			f.Interrupt(t.Context(), "the client left")
			if c := f.Cell(); c == nil || c.Status != service.CellInterrupted || c.Error == nil || c.Error.Name != "KeyboardInterrupt" {
				t.Fatalf("cell %+v, want interrupted with KeyboardInterrupt", f.Cell())
			}
			if c := runCell(t, s, id, "kept", 0); c.Result["text/plain"] != "7" || c.KernelStarted {
				t.Errorf("after the interrupt: %+v, want kept = 7 in the same kernel", c)
			}
		}},
		{"an ended cell's feed leaves the next cell alone", func(t *testing.T, s *service.Service, id string) {
			first, err := s.StartCell(t.Context(), keyA, id, service.CellArgs{Code: "1"})
			if err != nil {
				t.Fatal(err)
			}
			<-first.Done()
			next, err := s.StartCell(t.Context(), keyA, id, service.CellArgs{Code: "import time\nprint('started', flush=True)\ntime.sleep(1)\n'done'"})
			if err != nil {
				t.Fatal(err)
			}
			waitOutput(t, next)
			first.Interrupt(t.Context(), "the first cell's client left")
			select {
			case <-next.Done():
			case <-time.After(20 * time.Second):
				t.Fatal("the next cell did not end")
			}
			if c := next.Cell(); c.Status != service.CellOK || c.Result["text/plain"] != "'done'" {
				t.Errorf("the next cell %+v, want ok with 'done': another feed's Interrupt reached it", c)
			}
		}},
		{"ctx ends the wait, not the interrupt", func(t *testing.T, s *service.Service, id string) {
			f, err := s.StartCell(t.Context(), keyA, id, service.CellArgs{Code: "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('started', flush=True)\ntime.sleep(60)"})
			if err != nil {
				t.Fatal(err)
			}
			waitOutput(t, f)
			ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			f.Interrupt(ctx, "the client left")
			if d := time.Since(start); d > time.Second {
				t.Errorf("Interrupt waited %s past its ctx", d)
			}
			// The cell ignores SIGINT: the kernel is killed after the grace.
			select {
			case <-f.Done():
			case <-time.After(20 * time.Second):
				t.Fatal("the cell did not end after the grace")
			}
			if c := f.Cell(); c.Status != service.CellKernelDied {
				t.Errorf("cell %+v, want kernel-died", c)
			}
		}},
	}
	for _, be := range kernelBackends {
		for _, tc := range tests {
			t.Run(be.name+"/"+tc.name, func(t *testing.T) {
				s := be.new(t)
				id := kernelSandbox(t, s, true, nil)
				tc.run(t, s, id)
			})
		}
	}
}
