package tier

import (
	"bytes"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDrainAfterExit: output the command wrote before it exited is read
// however late its copier starts, while a background holder of the pipe
// that writes nothing (or writes without end) does not hold the result
// past a grace (or maxDrain).
func TestDrainAfterExit(t *testing.T) {
	const grace = 50 * time.Millisecond
	tests := []struct {
		name string
		// written before the "exit"; the writer end stays open (a
		// background process holds it).
		written string
		// copierDelay: how long the copier is not scheduled.
		copierDelay time.Duration
		// flood: the holder keeps writing.
		flood   bool
		want    string
		maxWait time.Duration
	}{
		{name: "copier starved past the grace still reads the output", written: "0\n", copierDelay: 4 * grace, want: "0\n", maxWait: maxDrain},
		{name: "silent background holder: stop after the grace", written: "out\n", want: "out\n", maxWait: grace + time.Second},
		{name: "flooding background holder: stop at maxDrain", flood: true, maxWait: maxDrain + time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if _, err := io.WriteString(w, tc.written); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			var flooders sync.WaitGroup
			if tc.flood {
				flooders.Add(1)
				go func() {
					defer flooders.Done()
					line := []byte(strings.Repeat("y", 100) + "\n")
					for {
						select {
						case <-stop:
							return
						default:
						}
						w.Write(line)
					}
				}()
			}
			var got bytes.Buffer
			drained := make(chan struct{})
			go func() {
				defer close(drained)
				time.Sleep(tc.copierDelay)
				io.Copy(&got, r)
			}()
			start := time.Now()
			DrainAfterExit(drained, []*os.File{r}, grace)
			took := time.Since(start)
			close(stop)
			// The flooder's write fails once the read end is closed.
			w.Close()
			flooders.Wait()
			if took > tc.maxWait {
				t.Errorf("DrainAfterExit took %v, want at most %v", took, tc.maxWait)
			}
			if tc.want != "" && got.String() != tc.want {
				t.Errorf("read %q, want %q", got.String(), tc.want)
			}
		})
	}
}
