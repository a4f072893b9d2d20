package service

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
)

// The code interpreter: one stateful Python kernel per sandbox, started on
// the first cell as one of the sandbox's commands (so its seccomp,
// Landlock, cgroup, audit record and server-wide slot are a command's),
// driven over its stdin and stdout by the framed protocol of kernel.py.

//go:embed kernel.py
var kernelDriver string

// Cell statuses.
const (
	CellOK          = "ok"
	CellError       = "error"
	CellInterrupted = "interrupted"
	CellTimeout     = "timeout"
	// CellKernelDied: the kernel ended during the cell (killed after a
	// timeout or an interrupt it ignored, out of memory, its command's
	// limits, os._exit); its state is lost and the next cell starts a
	// fresh one.
	CellKernelDied = "kernel-died"
)

// MaxCellCode bounds a cell's source.
const MaxCellCode = 1 << 20

// MaxCellRichBytes bounds the results, displays and error texts of one
// cell (text output has the manifest's stdout_bytes and stderr_bytes).
const MaxCellRichBytes = 16 << 20

// maxCellOutputs bounds the entries of one cell's outputs list.
const maxCellOutputs = 10000

// kernelGrace is how long a cell has to end after SIGINT before the
// kernel is killed.
var kernelGrace = 2 * time.Second

// kernelStartTimeout bounds the driver's start (IPython's import).
var kernelStartTimeout = 60 * time.Second

// CellArgs is one cell to run.
type CellArgs struct {
	Code string
	// Context names the kernel: "" or DefaultContext is the sandbox's
	// default one, started by its first cell; others are made with
	// CreateContext.
	Context string
	// Language is "python" ("" means python).
	Language string
	// Timeout bounds the cell; 0 is the manifest's resources.timeout, and
	// more is refused.
	Timeout time.Duration
}

// CellOutput is one thing a cell produced, in order: "stdout" and "stderr"
// (Text), "result" (the last expression's value) and "display" (Data: a
// MIME bundle, binary types in base64), "error" (Error).
type CellOutput struct {
	Type  string            `json:"type"`
	Text  string            `json:"text,omitempty"`
	Data  map[string]string `json:"data,omitempty"`
	Error *CellErrorInfo    `json:"error,omitempty"`
}

// CellErrorInfo is an exception a cell raised.
type CellErrorInfo struct {
	Name      string   `json:"name"`
	Value     string   `json:"value"`
	Traceback []string `json:"traceback"`
}

// Cell is a cell's outcome.
type Cell struct {
	ID        string       `json:"id"`
	SandboxID string       `json:"sandbox_id"`
	Context   string       `json:"context"`
	Language  string       `json:"language"`
	Status    string       `json:"status"`
	Outputs   []CellOutput `json:"outputs"`
	// Result is the last expression's MIME bundle, if it had a value.
	Result map[string]string `json:"result,omitempty"`
	// Error is the exception that ended the cell (or the timeout).
	Error *CellErrorInfo `json:"error,omitempty"`
	// Truncated: outputs past the caps were dropped.
	Truncated bool `json:"truncated"`
	// KernelStarted: this cell started a fresh kernel (the first cell, or
	// after a restart or a dead kernel): earlier state is gone.
	KernelStarted bool    `json:"kernel_started"`
	DurationMS    float64 `json:"duration_ms"`
}

// DefaultContext is the kernel every sandbox has.
const DefaultContext = "default"

// MaxContexts bounds the kernels (contexts) of one sandbox, the default
// one included: each is a process holding a command slot.
const MaxContexts = 8

// Kernel describes one of a sandbox's kernels (a context).
type Kernel struct {
	SandboxID string `json:"sandbox_id"`
	// Context is the kernel's name: "default", or the id CreateContext
	// gave it.
	Context string `json:"context"`
	// State is "none" (not started or ended), "idle" or "busy".
	State string `json:"state"`
	// ExecID is the command that runs it.
	ExecID  string `json:"exec_id,omitempty"`
	IPython bool   `json:"ipython"`
	Python  string `json:"python,omitempty"`
	// Cell is the running cell's id when busy.
	Cell string `json:"cell,omitempty"`
}

// CellEvent is one event of a cell: an output (Type stdout, stderr,
// result, display, error) or, last, "end" with the Cell.
type CellEvent struct {
	ID     int
	Output *CellOutput
	Cell   *Cell
}

// kernel is a sandbox's running kernel.
type kernel struct {
	ex    *execution
	stdin io.WriteCloser
	ready chan struct{}

	mu      sync.Mutex
	dec     frameDecoder
	ipython bool
	python  string
	cur     *cellRun
	dead    error // why the kernel can run nothing more
	cells   int
}

// cellRun is a running (or ended) cell and its events.
type cellRun struct {
	id      string
	sandbox string
	context string
	started time.Time
	caps    [2]int64 // stdout, stderr text bytes
	fresh   bool

	mu        sync.Mutex
	outputs   []CellOutput
	events    int // events appended: outputs, then end
	text      [2]int64
	rich      int64
	result    map[string]string
	err       *CellErrorInfo
	truncated bool
	status    string // set at end
	timedOut  bool
	cell      *Cell
	notify    chan struct{}
	done      chan struct{}
}

// kernelWriter is the kernel command's RawStdout.
type kernelWriter struct{ k *kernel }

func (w kernelWriter) Write(p []byte) (int, error) {
	w.k.mu.Lock()
	defer w.k.mu.Unlock()
	if w.k.dead != nil {
		return len(p), nil
	}
	if err := w.k.dec.write(p, w.k.deliverLocked); err != nil {
		w.k.dead = fmt.Errorf("the kernel broke its protocol (%v); it was killed", err)
		// Killed from another goroutine: Signal may wait on the tier.
		// Before kernelOf has set ex, kernelOf kills it.
		if ex := w.k.ex; ex != nil {
			go ex.proc.Signal(unix.SIGKILL)
		}
	}
	return len(p), nil
}

// deliverLocked handles one message; k.mu is held.
func (k *kernel) deliverLocked(m *kernelMsg) {
	if m.Type == "ready" {
		k.ipython, k.python = m.IPython, truncText(m.Python, 64)
		select {
		case <-k.ready:
		default:
			close(k.ready)
		}
		return
	}
	c := k.cur
	if c == nil || m.ID != c.id {
		// Output between cells (a background thread) belongs to none.
		return
	}
	switch m.Type {
	case "stream":
		c.addText(m.Name, m.Text)
	case "result":
		c.addRich(CellOutput{Type: "result", Data: m.Data}, true)
	case "display":
		c.addRich(CellOutput{Type: "display", Data: m.Data}, false)
	case "error":
		c.addRich(CellOutput{Type: "error", Error: &CellErrorInfo{Name: m.Ename, Value: m.Evalue, Traceback: nonNil(m.Traceback)}}, false)
	case "end":
		k.cur = nil
		c.finish(m.Status, nil)
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func truncText(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func (c *cellRun) changedLocked() {
	close(c.notify)
	c.notify = make(chan struct{})
}

func (c *cellRun) addText(name, text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status != "" {
		return
	}
	i := 0
	if name == "stderr" {
		i = 1
	}
	room := c.caps[i] - c.text[i]
	if int64(len(text)) > room {
		c.truncated = true
		n := int(max(room, 0))
		// Cut at a rune's start, so the kept text stays UTF-8.
		for n > 0 && !utf8.RuneStart(text[n]) {
			n--
		}
		text = text[:n]
	}
	if text == "" {
		return
	}
	c.text[i] += int64(len(text))
	if n := len(c.outputs); n > 0 && c.outputs[n-1].Type == name && n > c.sealedLocked() {
		c.outputs[n-1].Text += text
	} else if !c.appendLocked(CellOutput{Type: name, Text: text}) {
		return
	}
	c.changedLocked()
}

// sealedLocked is how many outputs a reader may already have seen: the
// last one is only merged into while no reader has (see Read).
func (c *cellRun) sealedLocked() int { return c.events }

func (c *cellRun) appendLocked(o CellOutput) bool {
	if len(c.outputs) >= maxCellOutputs {
		c.truncated = true
		return false
	}
	c.outputs = append(c.outputs, o)
	return true
}

func (c *cellRun) addRich(o CellOutput, main bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status != "" {
		return
	}
	size := int64(0)
	for k, v := range o.Data {
		size += int64(len(k) + len(v))
	}
	if o.Error != nil {
		size += int64(len(o.Error.Name) + len(o.Error.Value))
		for _, l := range o.Error.Traceback {
			size += int64(len(l))
		}
	}
	if c.rich+size > MaxCellRichBytes {
		c.truncated = true
		return
	}
	if !c.appendLocked(o) {
		return
	}
	c.rich += size
	if main {
		c.result = o.Data
	}
	if o.Error != nil {
		c.err = o.Error
	}
	c.changedLocked()
}

// finish ends the cell with status, once; override, when set, replaces
// the kernel's error (a timeout, a dead kernel).
func (c *cellRun) finish(status string, override *CellErrorInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status != "" {
		return
	}
	if c.timedOut && status != CellKernelDied {
		status = CellTimeout
	}
	c.status = status
	if override != nil {
		c.err = override
		if len(c.outputs) < maxCellOutputs {
			c.outputs = append(c.outputs, CellOutput{Type: "error", Error: override})
		}
	}
	outs := make([]CellOutput, len(c.outputs))
	copy(outs, c.outputs)
	c.cell = &Cell{ID: c.id, SandboxID: c.sandbox, Context: c.context, Language: "python", Status: status, Outputs: outs, Result: c.result, Error: c.err,
		Truncated: c.truncated, KernelStarted: c.fresh, DurationMS: float64(time.Since(c.started).Microseconds()) / 1000}
	c.changedLocked()
	close(c.done)
}

// CellFeed reads a running cell's events; see RunCell.
type CellFeed struct {
	c *cellRun
	k *kernel
}

// Interrupt interrupts the feed's cell, as InterruptKernel does, if it is
// still the one its kernel runs, and returns once the cell has ended (or
// ctx has); a cell that already ended is left alone, and so is the next
// cell of its context: a client that leaves must stop its own cell and
// never another's (the E2B code interpreter interrupts the cell whose
// caller went away, since nothing would read its outputs).
func (f *CellFeed) Interrupt(ctx context.Context, why string) {
	k, c := f.k, f.c
	k.mu.Lock()
	mine := k.cur == c
	k.mu.Unlock()
	if !mine {
		return
	}
	// k.interrupt signals the kernel's process: were c to end in between,
	// the SIGINT would reach an idle driver, which ignores it between
	// cells, and the next cell cannot start before this one's end frame.
	done := make(chan struct{})
	go func() {
		defer close(done)
		k.interrupt(c, why)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Read returns the events after id after and a channel closed on the next
// change. The end event (Cell set) is the last.
func (f *CellFeed) Read(after int) ([]CellEvent, <-chan struct{}) {
	c := f.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var evs []CellEvent
	for i := after; i < len(c.outputs); i++ {
		o := c.outputs[i]
		evs = append(evs, CellEvent{ID: i + 1, Output: &o})
	}
	// What a reader has seen is never merged into again.
	c.events = max(c.events, len(c.outputs))
	if c.cell != nil && after <= len(c.cell.Outputs) {
		cell := *c.cell
		evs = append(evs, CellEvent{ID: len(c.cell.Outputs) + 1, Cell: &cell})
	}
	return evs, c.notify
}

// Done is closed when the cell has ended.
func (f *CellFeed) Done() <-chan struct{} { return f.c.done }

// Cell is the ended cell (nil before).
func (f *CellFeed) Cell() *Cell {
	f.c.mu.Lock()
	defer f.c.mu.Unlock()
	return f.c.cell
}

// RunCell runs a cell in the kernel of key's sandbox id, starting the
// kernel first if it has none, and waits for it. When ctx ends first it
// returns ctx's error and the cell goes on.
func (s *Service) RunCell(ctx context.Context, key audit.Key, id string, args CellArgs) (Cell, error) {
	f, err := s.StartCell(ctx, key, id, args)
	if err != nil {
		return Cell{}, err
	}
	select {
	case <-f.Done():
		return *f.Cell(), nil
	case <-ctx.Done():
		return Cell{}, ctx.Err()
	}
}

// CheckCell refuses a cell the sandbox's manifest cannot run, naming the
// field.
func CheckCell(args *CellArgs, limit time.Duration) *Error {
	switch args.Language {
	case "", "python", "python3":
	default:
		return InvalidField("language", "%s has no kernel here; the code interpreter runs \"python\"", Quote(args.Language))
	}
	switch {
	case len(args.Code) > MaxCellCode:
		return InvalidField("code", "is %d bytes, over the %d-byte limit of a cell", len(args.Code), MaxCellCode)
	case args.Timeout < 0:
		return InvalidField("timeout", "%s is not positive", Quote(args.Timeout.String()))
	case args.Timeout > limit:
		return InvalidField("timeout", "%s is above the sandbox's resources.timeout %s", Quote(args.Timeout.String()), limit)
	}
	return nil
}

// StartCell starts a cell as RunCell does and returns its feed at once.
// A sandbox runs one cell at a time: another is a Conflict.
func (s *Service) StartCell(ctx context.Context, key audit.Key, id string, args CellArgs) (*CellFeed, error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return nil, e
	}
	limit := sb.manifest.Resources.Timeout.D()
	if e := CheckCell(&args, limit); e != nil {
		return nil, e
	}
	timeout := args.Timeout
	if timeout == 0 {
		timeout = limit
	}
	if e := s.screenCell(key, sb, args.Code); e != nil {
		return nil, e
	}
	name, e := sb.context(args.Context)
	if e != nil {
		return nil, e
	}
	sb.kernelTurn.Lock()
	defer sb.kernelTurn.Unlock()
	k, fresh, err := s.kernelOf(ctx, key, sb, name)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	if k.cur != nil {
		cur := k.cur.id
		k.mu.Unlock()
		return nil, conflict("cell %s is still running in context %s of sandbox %s: wait for it, interrupt it (POST /v1/sandboxes/%s/kernel/interrupt?context=%s), or run the cell in another context", cur, name, sb.id, sb.id, name)
	}
	k.cells++
	c := &cellRun{id: "c-" + strconv.Itoa(k.cells), sandbox: sb.id, context: name, started: time.Now(), fresh: fresh,
		caps:   [2]int64{int64(sb.manifest.Resources.StdoutBytes), int64(sb.manifest.Resources.StderrBytes)},
		notify: make(chan struct{}), done: make(chan struct{})}
	k.cur = c
	k.mu.Unlock()
	frame, err := encodeFrame(map[string]string{"type": "execute", "id": c.id, "code": args.Code})
	if err == nil {
		// A kernel that stops reading its stdin (a cell replaced the
		// driver's loop) must not hold this sandbox's kernel turn.
		if d, ok := k.stdin.(interface{ SetWriteDeadline(time.Time) error }); ok {
			d.SetWriteDeadline(time.Now().Add(kernelStartTimeout))
		}
		_, err = k.stdin.Write(frame)
	}
	if err != nil {
		// A kernel that does not take its cell is of no more use: kill
		// it rather than leave it holding its slot until its timeout.
		k.fail(fmt.Errorf("sending the cell to the kernel: %w; the kernel was killed", err))
		k.ex.proc.Signal(unix.SIGKILL)
		return &CellFeed{c, k}, nil
	}
	s.goSafe("cell timer", func() { k.time(c, timeout) })
	return &CellFeed{c, k}, nil
}

// time interrupts c when it runs past timeout, and kills the kernel when
// it does not stop.
func (k *kernel) time(c *cellRun, timeout time.Duration) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-c.done:
		return
	case <-t.C:
	}
	c.mu.Lock()
	c.timedOut = true
	c.mu.Unlock()
	k.interrupt(c, fmt.Sprintf("the cell ran past its timeout of %s", timeout))
}

// interrupt sends SIGINT for c, then kills the kernel when c has not ended
// after kernelGrace.
func (k *kernel) interrupt(c *cellRun, why string) {
	k.ex.proc.Signal(unix.SIGINT)
	t := time.NewTimer(kernelGrace)
	defer t.Stop()
	select {
	case <-c.done:
		return
	case <-t.C:
	}
	k.fail(fmt.Errorf("%s; it did not stop within %s of SIGINT, so the kernel was killed and its state is lost", why, kernelGrace))
	k.ex.proc.Signal(unix.SIGKILL)
}

// fail marks the kernel dead for why and ends its running cell.
func (k *kernel) fail(why error) {
	k.mu.Lock()
	if k.dead == nil {
		k.dead = why
	}
	c := k.cur
	k.cur = nil
	dead := k.dead
	k.mu.Unlock()
	if c != nil {
		c.finish(CellKernelDied, &CellErrorInfo{Name: "KernelDied", Value: dead.Error(), Traceback: []string{}})
	}
}

func encodeFrame(v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append([]byte(strconv.Itoa(len(data))+"\n"), data...), nil
}

// kernelOf returns sb's live kernel of context name, starting one when it
// has none (fresh true). sb.kernelTurn is held.
func (s *Service) kernelOf(ctx context.Context, key audit.Key, sb *sandbox, name string) (*kernel, bool, error) {
	sb.mu.Lock()
	k := sb.kernels[name]
	sb.mu.Unlock()
	if k != nil {
		k.mu.Lock()
		dead := k.dead
		k.mu.Unlock()
		if dead == nil && !k.ex.isDone() {
			return k, false, nil
		}
	}
	k = &kernel{ready: make(chan struct{})}
	ex, err := s.startExec(ctx, key, sb.id, ExecArgs{
		Argv:      []string{"python3", "-c", kernelDriver},
		Env:       map[string]string{"MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"},
		StdinOpen: true,
		kernel:    kernelWriter{k},
	})
	if err != nil {
		return nil, false, err
	}
	k.mu.Lock()
	k.ex, k.stdin = ex, ex.proc.Stdin()
	broken := k.dead != nil
	k.mu.Unlock()
	if broken {
		ex.proc.Signal(unix.SIGKILL)
	}
	s.goSafe("kernel watcher", func() {
		<-ex.done
		why := "the kernel ended"
		if res := ex.view().Result; res != nil {
			why = fmt.Sprintf("the kernel (command %s) ended: %s", ex.id, res.Termination)
			if res.Error != "" {
				why += ": " + res.Error
			}
		}
		k.fail(errors.New(why + "; its state is lost, and the next cell starts a fresh kernel"))
	})
	t := time.NewTimer(kernelStartTimeout)
	defer t.Stop()
	select {
	case <-k.ready:
	case <-ex.done:
		return nil, false, conflict("the code kernel of sandbox %s ended as it started (%s): does the image have python3? %s", sb.id, ex.view().Result.Termination, startStderr(ex))
	case <-t.C:
		ex.proc.Signal(unix.SIGKILL)
		return nil, false, conflict("the code kernel of sandbox %s did not start within %s; it was killed", sb.id, kernelStartTimeout)
	case <-ctx.Done():
		ex.proc.Signal(unix.SIGKILL)
		return nil, false, ctx.Err()
	}
	sb.mu.Lock()
	if sb.kernels == nil {
		sb.kernels = map[string]*kernel{}
	}
	sb.kernels[name] = k
	sb.mu.Unlock()
	return k, true, nil
}

// startStderr is the end of an ended kernel's stderr, for the error that
// says why it did not start.
func startStderr(ex *execution) string {
	res := ex.view().Result
	if res == nil || res.Stderr.Encoding != "utf-8" {
		return ""
	}
	t := res.Stderr.Data
	if len(t) > 2000 {
		t = t[len(t)-2000:]
	}
	return "its stderr: " + Quote(t)
}

// kernelIn returns key's sandbox id, the context's name and its live
// kernel (nil: none).
func (s *Service) kernelIn(key audit.Key, id, context string) (*sandbox, string, *kernel, *Error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return nil, "", nil, e
	}
	name, e := sb.context(context)
	if e != nil {
		return nil, "", nil, e
	}
	sb.mu.Lock()
	k := sb.kernels[name]
	sb.mu.Unlock()
	if k != nil {
		k.mu.Lock()
		dead := k.dead != nil
		k.mu.Unlock()
		if dead || k.ex.isDone() {
			k = nil
		}
	}
	return sb, name, k, nil
}

func (k *kernel) view(sb *sandbox, name string) Kernel {
	v := Kernel{SandboxID: sb.id, Context: name, State: "none"}
	if k == nil {
		return v
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	v.State, v.ExecID, v.IPython, v.Python = "idle", k.ex.id, k.ipython, k.python
	if k.cur != nil {
		v.State, v.Cell = "busy", k.cur.id
	}
	return v
}

// GetKernel describes the kernel of context ("": the default) of key's
// sandbox id.
func (s *Service) GetKernel(ctx context.Context, key audit.Key, id, context string) (Kernel, error) {
	sb, name, k, e := s.kernelIn(key, id, context)
	if e != nil {
		return Kernel{}, e
	}
	return k.view(sb, name), nil
}

// InterruptKernel interrupts the running cell of key's sandbox id (SIGINT:
// KeyboardInterrupt in the cell); a cell that does not stop within
// kernelGrace has its kernel killed. It returns once the cell has ended.
// No running cell is a Conflict.
func (s *Service) InterruptKernel(ctx context.Context, key audit.Key, id, context string) (Kernel, error) {
	sb, name, k, e := s.kernelIn(key, id, context)
	if e != nil {
		return Kernel{}, e
	}
	var c *cellRun
	if k != nil {
		k.mu.Lock()
		c = k.cur
		k.mu.Unlock()
	}
	if c == nil {
		return Kernel{}, conflict("context %s of sandbox %s has no running cell to interrupt", name, sb.id)
	}
	k.interrupt(c, "the cell was interrupted")
	select {
	case <-c.done:
	case <-ctx.Done():
		return Kernel{}, ctx.Err()
	}
	_, _, k, _ = s.kernelIn(key, id, name)
	return k.view(sb, name), nil
}

// RestartKernel kills the kernel of key's sandbox id, if any (its running
// cell ends as kernel-died), and starts a fresh one: variables and imports
// are gone, files stay.
func (s *Service) RestartKernel(ctx context.Context, key audit.Key, id, context string) (Kernel, error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return Kernel{}, e
	}
	name, e := sb.context(context)
	if e != nil {
		return Kernel{}, e
	}
	sb.kernelTurn.Lock()
	defer sb.kernelTurn.Unlock()
	if err := sb.stopKernel(ctx, name, "the kernel was restarted; its state is lost"); err != nil {
		return Kernel{}, err
	}
	k, _, err := s.kernelOf(ctx, key, sb, name)
	if err != nil {
		return Kernel{}, err
	}
	return k.view(sb, name), nil
}

// stopKernel kills the kernel of context name, if it has one, and waits
// for its end; the context stays. sb.kernelTurn is held.
func (sb *sandbox) stopKernel(ctx context.Context, name, why string) error {
	sb.mu.Lock()
	old := sb.kernels[name]
	if old != nil {
		sb.kernels[name] = nil
	}
	sb.mu.Unlock()
	if old == nil {
		return nil
	}
	old.fail(errors.New(why))
	old.ex.proc.Signal(unix.SIGKILL)
	select {
	case <-old.ex.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// context resolves a context's name: "" is the default; any other must
// have been made by CreateContext.
func (sb *sandbox) context(name string) (string, *Error) {
	if name == "" || name == DefaultContext {
		return DefaultContext, nil
	}
	sb.mu.Lock()
	_, ok := sb.kernels[name]
	sb.mu.Unlock()
	if !ok {
		return "", &Error{Kind: NotFound, Field: "context", Message: fmt.Sprintf("context %s is not one of sandbox %s: make one with POST /v1/sandboxes/%s/contexts, or leave context out for the default", Quote(name), sb.id, sb.id)}
	}
	return name, nil
}

// CreateContext starts a new kernel in key's sandbox id, with state of its
// own, and returns it once it is ready. A sandbox has at most MaxContexts,
// the default one included.
func (s *Service) CreateContext(ctx context.Context, key audit.Key, id string) (Kernel, error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return Kernel{}, e
	}
	sb.kernelTurn.Lock()
	defer sb.kernelTurn.Unlock()
	sb.mu.Lock()
	n := len(sb.kernels)
	if _, ok := sb.kernels[DefaultContext]; !ok {
		n++ // the default context always counts
	}
	sb.contextSeq++
	name := "ctx-" + strconv.Itoa(sb.contextSeq)
	sb.mu.Unlock()
	if n >= MaxContexts {
		return Kernel{}, conflict("sandbox %s has %d contexts, the most it may have: delete one (DELETE /v1/sandboxes/%s/contexts/{context})", sb.id, MaxContexts, sb.id)
	}
	k, _, err := s.kernelOf(ctx, key, sb, name)
	if err != nil {
		return Kernel{}, err
	}
	return k.view(sb, name), nil
}

// ListContexts describes the kernels of key's sandbox id, the default one
// first, then in creation order.
func (s *Service) ListContexts(ctx context.Context, key audit.Key, id string) ([]Kernel, error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return nil, e
	}
	sb.mu.Lock()
	names := make([]string, 0, len(sb.kernels)+1)
	for name := range sb.kernels {
		if name != DefaultContext {
			names = append(names, name)
		}
	}
	sb.mu.Unlock()
	slices.SortFunc(names, func(a, b string) int {
		na, _ := strconv.Atoi(strings.TrimPrefix(a, "ctx-"))
		nb, _ := strconv.Atoi(strings.TrimPrefix(b, "ctx-"))
		return na - nb
	})
	out := make([]Kernel, 0, len(names)+1)
	for _, name := range append([]string{DefaultContext}, names...) {
		_, _, k, e := s.kernelIn(key, id, name)
		if e != nil {
			continue // deleted meanwhile
		}
		out = append(out, k.view(sb, name))
	}
	return out, nil
}

// DeleteContext kills the kernel of context name of key's sandbox id and
// forgets the context. The default context cannot be deleted (restart it).
func (s *Service) DeleteContext(ctx context.Context, key audit.Key, id, context string) error {
	sb, e := s.lookup(key, id)
	if e != nil {
		return e
	}
	name, e := sb.context(context)
	if e != nil {
		return e
	}
	if name == DefaultContext {
		return InvalidField("context", "the default context cannot be deleted; restart it (POST /v1/sandboxes/%s/kernel/restart) to lose its state", sb.id)
	}
	sb.kernelTurn.Lock()
	defer sb.kernelTurn.Unlock()
	if err := sb.stopKernel(ctx, name, "the context was deleted"); err != nil {
		return err
	}
	sb.mu.Lock()
	delete(sb.kernels, name)
	sb.mu.Unlock()
	return nil
}

// screenCell holds a cell to the operator's effects policy as the same
// code run as a command (python3 -c CODE) is held: a denied cell is
// refused and recorded as a denied command is; a cell that needs a
// person's approval is refused too, since a cell cannot wait for one
// (the kernel's state would move on without it): the caller may run the
// code as a command, which can.
func (s *Service) screenCell(key audit.Key, sb *sandbox, code string) *Error {
	p := s.effectsPolicy()
	if p == nil {
		return nil
	}
	argv := []string{"python3", "-c", code}
	sb.mu.Lock()
	clone := sb.fx.Clone()
	held, denied := screen(p, clone, argv, sb.remembered)
	if denied == nil && held == nil {
		sb.fx = clone
	}
	sb.mu.Unlock()
	if denied != nil {
		e := s.refuse(key, sb.id, sb.manifest, argv, denied)
		e.Field = "code"
		return e
	}
	if held != nil {
		return &Error{Kind: Forbidden, Field: "code",
			Message: "the cell needs a person's approval under the operator's effects policy: " + plainEffects(held) +
				"; a cell cannot wait for one: run the code as a command (POST /v1/sandboxes/" + sb.id + "/execs with code and language), which waits for the approval"}
	}
	return nil
}
