package imagebuild

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"
)

// tailLines is how much of a failed RUN step's output its error quotes.
const tailLines = 20

// stepOutput streams a RUN step's output to the progress writer line by
// line (indented on a terminal, prefixed with the step number on plain
// output so interleaved logs stay readable) and keeps the last lines for
// the error of a failed step. stdout and stderr share it.
type stepOutput struct {
	mu      sync.Mutex
	w       io.Writer
	prefix  string
	partial bytes.Buffer
	tail    []string
}

func newStepOutput(w io.Writer, step int, terminal bool) *stepOutput {
	prefix := fmt.Sprintf("step %d| ", step)
	if terminal {
		prefix = "    │ "
	}
	return &stepOutput{w: w, prefix: prefix}
}

func (o *stepOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.partial.Write(p)
	for {
		i := bytes.IndexByte(o.partial.Bytes(), '\n')
		if i < 0 {
			break
		}
		o.line(string(o.partial.Next(i + 1)[:i]))
	}
	// A step that prints a very long line without newline must not
	// grow the buffer without bound.
	if o.partial.Len() > 64<<10 {
		o.line(o.partial.String())
		o.partial.Reset()
	}
	return len(p), nil
}

func (o *stepOutput) line(l string) {
	l = strings.TrimRight(l, "\r")
	fmt.Fprintf(o.w, "%s%s\n", o.prefix, l)
	if len(l) > 500 {
		l = l[:500] + "..."
	}
	o.tail = append(o.tail, l)
	if len(o.tail) > tailLines {
		o.tail = o.tail[len(o.tail)-tailLines:]
	}
}

// Flush writes an unterminated last line.
func (o *stepOutput) Flush() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.partial.Len() > 0 {
		o.line(o.partial.String())
		o.partial.Reset()
	}
}

// Tail returns the step's last lines of output.
func (o *stepOutput) Tail() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Join(o.tail, "\n")
}
