package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// CellRequest is one cell of code for a sandbox's stateful kernel.
type CellRequest struct {
	Code string
	// Context names the kernel ("" is the sandbox's default one).
	Context string
	// Language is "python" ("" means python).
	Language string
	// Timeout bounds the cell; 0 means the sandbox's resources.timeout,
	// which is also the maximum.
	Timeout time.Duration
}

// Cell is what a cell produced (docs/API.md, "Code interpreter").
type Cell struct {
	ID        string       `json:"id"`
	SandboxID string       `json:"sandbox_id"`
	Context   string       `json:"context"`
	Language  string       `json:"language"`
	Status    string       `json:"status"`
	Outputs   []CellOutput `json:"outputs"`
	// Result is the last expression's MIME bundle ("text/plain",
	// "text/html", "image/png" in base64, ...), if it had a value.
	Result map[string]string `json:"result,omitempty"`
	// Error is the exception that ended the cell (or its timeout).
	Error *CellError `json:"error,omitempty"`
	// Truncated: outputs past the cell's caps were dropped.
	Truncated bool `json:"truncated"`
	// KernelStarted: this cell started a fresh kernel; earlier state is
	// gone.
	KernelStarted bool    `json:"kernel_started"`
	DurationMS    float64 `json:"duration_ms"`
}

// CellOutput is one thing a cell produced, in order: "stdout" and
// "stderr" (Text), "result" and "display" (Data, a MIME bundle), "error".
type CellOutput struct {
	Type  string            `json:"type"`
	Text  string            `json:"text,omitempty"`
	Data  map[string]string `json:"data,omitempty"`
	Error *CellError        `json:"error,omitempty"`
}

// CellError is an exception a cell raised.
type CellError struct {
	Name      string   `json:"name"`
	Value     string   `json:"value"`
	Traceback []string `json:"traceback"`
}

// RunCell runs one cell in the sandbox's kernel (started by the first
// cell) and waits for it: variables, imports and files persist from cell
// to cell. An exception in the code is Cell.Error, not an error.
func (s *Sandbox) RunCell(ctx context.Context, req *CellRequest) (*Cell, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if req == nil {
		return nil, fmt.Errorf("moat client: RunCell: nil request")
	}
	if req.Timeout < 0 {
		return nil, fmt.Errorf("moat client: CellRequest.Timeout %v is negative; give 0 for the sandbox's timeout or a positive duration", req.Timeout)
	}
	w := struct {
		Code     string `json:"code"`
		Context  string `json:"context,omitempty"`
		Language string `json:"language,omitempty"`
		Timeout  string `json:"timeout,omitempty"`
	}{Code: req.Code, Context: req.Context, Language: req.Language}
	if req.Timeout > 0 {
		w.Timeout = durationString(req.Timeout)
	}
	body, _ := json.Marshal(w)
	var c Cell
	if err := s.c.doJSON(ctx, http.MethodPost, s.path()+"/cells", nil, body, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// InterruptKernel interrupts the cell running in the kernel of context
// ("" is the default one), as ^C would; its state is kept.
func (s *Sandbox) InterruptKernel(ctx context.Context, context string) error {
	return s.kernelOp(ctx, "interrupt", context)
}

// RestartKernel ends the kernel of context ("" is the default one): its
// variables are lost, the workspace's files are kept, and the next cell
// starts a fresh kernel.
func (s *Sandbox) RestartKernel(ctx context.Context, context string) error {
	return s.kernelOp(ctx, "restart", context)
}

func (s *Sandbox) kernelOp(ctx context.Context, op, kctx string) error {
	if err := s.check(); err != nil {
		return err
	}
	var q url.Values
	if kctx != "" {
		q = url.Values{"context": {kctx}}
	}
	return s.c.doJSON(ctx, http.MethodPost, s.path()+"/kernel/"+op, q, []byte("{}"), nil)
}

// Kernel describes one kernel (context) of a sandbox.
type Kernel struct {
	SandboxID string `json:"sandbox_id"`
	// Context is the kernel's name: "default", or CreateContext's id.
	Context string `json:"context"`
	// State is "none" (not started or ended), "idle" or "busy".
	State   string `json:"state"`
	IPython bool   `json:"ipython"`
	Python  string `json:"python,omitempty"`
}

// CreateContext makes another kernel in the sandbox, with state of its
// own; give its Context in CellRequest.Context.
func (s *Sandbox) CreateContext(ctx context.Context) (*Kernel, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	var k Kernel
	if err := s.c.doJSON(ctx, http.MethodPost, s.path()+"/contexts", nil, []byte("{}"), &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// DeleteContext ends a kernel CreateContext made.
func (s *Sandbox) DeleteContext(ctx context.Context, context string) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.c.doJSON(ctx, http.MethodDelete, s.path()+"/contexts/"+url.PathEscape(context), nil, nil, nil)
}
