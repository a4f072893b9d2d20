package ociruntime

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Logger writes the runtime's log: --log, in text or in JSON lines
// {"level","msg","time"}. containerd's shim and dockerd read the last
// error line of this file and show it to their user, so every refusal is
// logged here.
type Logger struct {
	mu    sync.Mutex
	w     io.Writer
	json  bool
	debug bool
}

// NewLogger logs to w (nil: nowhere) in format "text" or "json".
func NewLogger(w io.Writer, format string, debug bool) (*Logger, error) {
	switch format {
	case "", "text":
		return &Logger{w: w, debug: debug}, nil
	case "json":
		return &Logger{w: w, json: true, debug: debug}, nil
	}
	return nil, fmt.Errorf("--log-format %q: use text or json", format)
}

// OpenLog opens the --log file for appending ("" logs nowhere).
func OpenLog(path string) (io.Writer, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--log %s: %w", path, err)
	}
	return f, nil
}

func (l *Logger) log(level, msg string) {
	if l == nil || l.w == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	if l.json {
		b, _ := json.Marshal(struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Time  string `json:"time"`
		}{level, msg, now})
		l.w.Write(append(b, '\n'))
		return
	}
	fmt.Fprintf(l.w, "time=%q level=%s msg=%q\n", now, level, msg)
}

// Errorf logs an error.
func (l *Logger) Errorf(format string, a ...any) { l.log("error", fmt.Sprintf(format, a...)) }

// Warnf logs a warning: something asked for and not given.
func (l *Logger) Warnf(format string, a ...any) { l.log("warning", fmt.Sprintf(format, a...)) }

// Debugf logs with --debug only.
func (l *Logger) Debugf(format string, a ...any) {
	if l != nil && l.debug {
		l.log("debug", fmt.Sprintf(format, a...))
	}
}
